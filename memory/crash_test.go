package memory

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

const crashChildEnv = "KVSIDECAR_MEMORY_CRASH_CHILD_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		crashChild(dir)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func crashContent(i int) string { return fmt.Sprintf("message %d %s", i, strings.Repeat("x", i%97)) }
func crashReply(i int) string   { return fmt.Sprintf("reply %d %s", i, strings.Repeat("y", i%89)) }

// crashChild appends forever with the default fsync policy (always),
// printing each acknowledged message, until the parent kills it.
func crashChild(dir string) {
	s, err := Open(Options{Dir: dir, Window: WindowOptions{Limit: 4096}})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(2)
	}
	for i := 0; ; i++ {
		tr, err := s.Prepare(context.Background(), TurnRequest{Tenant: "tenant", SessionID: "crash", Mode: ModeAppend, Model: "m", Messages: []Message{NewMessage("user", crashContent(i))}})
		if err != nil {
			fmt.Println("prepare:", err)
			os.Exit(2)
		}
		fmt.Printf("user %d\n", i) // os.Stdout is unbuffered: printed means acknowledged
		if err := tr.Complete(NewMessage("assistant", crashReply(i))); err != nil {
			fmt.Println("complete:", err)
			os.Exit(2)
		}
		fmt.Printf("reply %d\n", i)
	}
}

func TestKill9KeepsAcknowledgedRecords(t *testing.T) {
	dir := t.TempDir()
	var ackedUsers, ackedReplies []int // per round: highest acknowledged
	for round := 0; round < 2; round++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		acked := map[string]int{"user": -1, "reply": -1}
		sc := bufio.NewScanner(out)
		killed := false
		for sc.Scan() {
			kind, n, ok := strings.Cut(sc.Text(), " ")
			i, err := strconv.Atoi(n)
			if !ok || err != nil {
				t.Fatalf("child said %q", sc.Text())
			}
			acked[kind] = i
			// Kill at a different point each round, mid-stream.
			if !killed && acked["user"] >= 40+round*17 {
				cmd.Process.Signal(syscall.SIGKILL)
				killed = true
			}
		}
		cmd.Wait()
		if !killed {
			t.Fatalf("child ended before it was killed")
		}
		ackedUsers = append(ackedUsers, acked["user"])
		ackedReplies = append(ackedReplies, acked["reply"])

		s, err := Open(Options{Dir: dir, Window: WindowOptions{Limit: 4096}})
		if err != nil {
			t.Fatal(err)
		}
		v, err := s.Session("tenant", "crash")
		if err != nil {
			t.Fatal(err)
		}
		// Every acknowledged message is there and intact. Each round
		// continues the same session with numbers from 0 again, so message
		// i appears once per round that acknowledged it (or more: a write
		// can land without its acknowledgement being printed).
		users, replies := map[int]int{}, map[int]int{}
		for _, m := range v.Messages {
			var i int
			switch {
			case m.Role == "user":
				if _, err := fmt.Sscanf(m.Content, "message %d", &i); err != nil || m.Content != crashContent(i) {
					t.Fatalf("message damaged: %q", m.Content)
				}
				users[i]++
			case m.Role == "assistant":
				if _, err := fmt.Sscanf(m.Content, "reply %d", &i); err != nil || m.Content != crashReply(i) {
					t.Fatalf("reply damaged: %q", m.Content)
				}
				replies[i]++
			}
		}
		check := func(kind string, got map[int]int, acked []int) {
			for i := 0; i <= slices.Max(acked); i++ {
				want := 0
				for _, a := range acked {
					if a >= i {
						want++
					}
				}
				if got[i] < want {
					t.Fatalf("round %d: acknowledged %s %d present %d times, want %d", round, kind, i, got[i], want)
				}
			}
		}
		check("message", users, ackedUsers)
		check("reply", replies, ackedReplies)
		s.Close()
	}
}
