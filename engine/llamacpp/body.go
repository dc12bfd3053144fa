package llamacpp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// setSlotFields returns body with the top-level "id_slot" set to slot and
// "cache_prompt" set to true, and, when reuse > 0 and the body has none of
// its own, "n_cache_reuse" set to reuse (the server then moves chunks of at
// least reuse tokens of the slot's KV to where the new prompt has them,
// see Options.CacheReuse). Other members keep their order and bytes; when
// neither id_slot nor cache_prompt is present the body is only prefixed.
// body must be a JSON object; otherwise the error says why and body should
// be forwarded as it is.
func setSlotFields(body []byte, slot, reuse int) ([]byte, error) {
	t := bytes.TrimLeft(body, " \t\r\n")
	if len(t) == 0 || t[0] != '{' {
		return body, fmt.Errorf("engine: request body is not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(t))
	dec.UseNumber()
	if _, err := dec.Token(); err != nil {
		return body, fmt.Errorf("engine: request body: %w", err)
	}
	type member struct {
		key string
		val json.RawMessage
	}
	var (
		members  []member
		present  bool
		hasReuse bool
	)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return body, fmt.Errorf("engine: request body: %w", err)
		}
		k, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return body, fmt.Errorf("engine: request body: %w", err)
		}
		if k == "id_slot" || k == "cache_prompt" {
			present = true
		}
		hasReuse = hasReuse || k == "n_cache_reuse"
		members = append(members, member{k, v})
	}
	if _, err := dec.Token(); err != nil {
		return body, fmt.Errorf("engine: request body: %w", err)
	}
	if rest := bytes.TrimSpace(t[dec.InputOffset():]); len(rest) != 0 {
		return body, fmt.Errorf("engine: request body: data after the object")
	}
	out := make([]byte, 0, len(body)+40)
	out = append(out, `{"id_slot":`...)
	out = strconv.AppendInt(out, int64(slot), 10)
	out = append(out, `,"cache_prompt":true`...)
	if reuse > 0 && !hasReuse {
		out = append(out, `,"n_cache_reuse":`...)
		out = strconv.AppendInt(out, int64(reuse), 10)
	}
	if !present {
		if len(members) > 0 {
			out = append(out, ',')
			out = append(out, bytes.TrimLeft(t[1:], " \t\r\n")...)
		} else {
			out = append(out, '}')
		}
		return out, nil
	}
	for _, m := range members {
		if m.key == "id_slot" || m.key == "cache_prompt" {
			continue
		}
		out = append(out, ',')
		kb, _ := json.Marshal(m.key)
		out = append(out, kb...)
		out = append(out, ':')
		out = append(out, m.val...)
	}
	return append(out, '}'), nil
}
