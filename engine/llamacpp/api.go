package llamacpp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// llamaAPI is the llama.cpp server's HTTP surface the connector uses:
// slot actions, the slot list and what identifies the model.
type llamaAPI struct {
	base   string // server root, no trailing slash
	client *http.Client
}

// slotResponse is the part of a slot action answer the connector reads.
type slotResponse struct {
	NSaved    *int64 `json:"n_saved"`
	NWritten  *int64 `json:"n_written"`
	NRestored *int64 `json:"n_restored"`
	NRead     *int64 `json:"n_read"`
	Error     *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// errSlotAPI is an HTTP answer that is not a success.
type errSlotAPI struct {
	status int
	msg    string
}

func (e *errSlotAPI) Error() string {
	return fmt.Sprintf("HTTP %d: %s", e.status, e.msg)
}

// unsupported reports whether an answer means the server has no usable
// slot API.
func (e *errSlotAPI) unsupported() (string, bool) {
	m := strings.ToLower(e.msg)
	switch {
	case strings.Contains(m, "slot-save-path") || strings.Contains(m, "does not support slots"):
		return "the server was started without --slot-save-path", true
	case e.status == http.StatusNotFound || e.status == http.StatusMethodNotAllowed:
		return fmt.Sprintf("the server has no slot API (POST /slots/{id} answered HTTP %d)", e.status), true
	case e.status == http.StatusNotImplemented:
		return "the server does not implement slot actions (HTTP 501)", true
	}
	return "", false
}

// call sends one request and reads at most limit bytes of the answer; a
// status outside 2xx is an *errSlotAPI.
func (a *llamaAPI) call(ctx context.Context, method, path string, body any, limit int64) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	hr, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	// Every call here may be sent twice (slot save, restore and erase
	// name their file; the probe is a temperature-0 completion without
	// the prompt cache): marked replayable, without sending the header,
	// so net/http retries a call that failed on a reused connection the
	// server had closed before reading it.
	hr.Header["Idempotency-Key"] = nil
	res, err := a.client.Do(hr)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, limit))
	if err != nil {
		return nil, err
	}
	if res.StatusCode < 200 || res.StatusCode >= 300 {
		msg := strings.TrimSpace(string(data))
		var e struct {
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(data, &e) == nil && e.Error != nil && e.Error.Message != "" {
			msg = e.Error.Message
		}
		return data, &errSlotAPI{status: res.StatusCode, msg: msg}
	}
	return data, nil
}

// slotAction runs POST /slots/{slot}?action=save|restore|erase.
func (a *llamaAPI) slotAction(ctx context.Context, slot int, action, filename string) (slotResponse, error) {
	var sr slotResponse
	var body any = map[string]string{}
	if filename != "" {
		body = map[string]string{"filename": filename}
	}
	data, err := a.call(ctx, http.MethodPost, "/slots/"+strconv.Itoa(slot)+"?action="+action, body, 64<<10)
	_ = json.Unmarshal(data, &sr)
	return sr, err
}

// serverSlot is one entry of GET /slots: a slot never used since the
// server started has no id_task.
type serverSlot struct {
	ID           int   `json:"id"`
	IDTask       *int  `json:"id_task"`
	NPrompt      int   `json:"n_prompt_tokens"`
	IsProcessing bool  `json:"is_processing"`
	NCtx         int64 `json:"n_ctx"`
}

// slots runs GET /slots.
func (a *llamaAPI) slots(ctx context.Context) ([]serverSlot, error) {
	data, err := a.call(ctx, http.MethodGet, "/slots", nil, 16<<20)
	if err != nil {
		return nil, err
	}
	var ss []serverSlot
	if err := json.Unmarshal(data, &ss); err != nil {
		return nil, fmt.Errorf("GET /slots: %w", err)
	}
	return ss, nil
}

// fingerprint names the model a server runs, as far as its KV goes: the
// model's size and shape (/v1/models meta), the slot context and chat
// template (/props), and the top next tokens of a fixed probe prompt
// (/completion), which tells apart two models of one shape. A state saved
// under one fingerprint is never restored under another. probeSlot is the
// slot the probe may use (it holds no session's KV). A server that cannot
// answer the probe is fingerprinted without it.
func (a *llamaAPI) fingerprint(ctx context.Context, probeSlot int) (string, error) {
	h := sha256.New()
	models, err := a.call(ctx, http.MethodGet, "/v1/models", nil, 1<<20)
	if err != nil {
		return "", fmt.Errorf("GET /v1/models: %w", err)
	}
	var m struct {
		Data []struct {
			Meta json.RawMessage `json:"meta"`
		} `json:"data"`
	}
	if err := json.Unmarshal(models, &m); err != nil || len(m.Data) == 0 {
		return "", fmt.Errorf("GET /v1/models: no model in %.200q", models)
	}
	h.Write(m.Data[0].Meta)
	props, err := a.call(ctx, http.MethodGet, "/props", nil, 4<<20)
	if err != nil {
		return "", fmt.Errorf("GET /props: %w", err)
	}
	var p struct {
		Settings struct {
			NCtx int64 `json:"n_ctx"`
		} `json:"default_generation_settings"`
		Template string `json:"chat_template"`
		BOS      string `json:"bos_token"`
		EOS      string `json:"eos_token"`
	}
	if err := json.Unmarshal(props, &p); err != nil {
		return "", fmt.Errorf("GET /props: %w", err)
	}
	fmt.Fprintf(h, "\x00%d\x00%s\x00%s\x00%s", p.Settings.NCtx, p.Template, p.BOS, p.EOS)
	// One token (n_predict 1) is all the fingerprint reads: the probe
	// holds a slot for a single decoding step.
	probe, err := a.call(ctx, http.MethodPost, "/completion", map[string]any{
		"prompt": "kvsidecar model fingerprint: the quick brown fox", "n_predict": 1, "n_probs": 8,
		"temperature": 0, "cache_prompt": false, "id_slot": probeSlot, "grammar": "root ::= [a-z]",
	}, 1<<20)
	if err == nil {
		var r struct {
			Probs []struct {
				Top []struct {
					ID int `json:"id"`
				} `json:"top_logprobs"`
			} `json:"completion_probabilities"`
		}
		if json.Unmarshal(probe, &r) == nil && len(r.Probs) > 0 {
			var ids []int
			for _, t := range r.Probs[0].Top {
				ids = append(ids, t.ID)
			}
			slices.Sort(ids)
			fmt.Fprintf(h, "\x00probe%v", ids)
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:12]), nil
}
