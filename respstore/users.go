package respstore

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// User is one account of Options.Users: a name, its password and its own
// quota.
type User struct {
	Name     string
	Password string
	// Quota caps the bytes the user's keys hold; zero means Options.Quota.
	Quota int64
}

// ParseUsers reads a users file: one account a line, "name password
// [quota]", fields separated by spaces or tabs; blank lines and lines
// starting with # are skipped. A name is 1 to 40 bytes of letters, digits
// and _.=-; a quota is bytes, or a number with a unit (KiB, MiB, GiB,
// TiB, KB, MB, GB, TB).
func ParseUsers(r io.Reader) ([]User, error) {
	var out []User
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 || len(f) > 3 {
			return nil, fmt.Errorf("respstore: users line %d: want \"name password [quota]\"", n)
		}
		u := User{Name: f[0], Password: f[1]}
		if !validName(u.Name) {
			return nil, fmt.Errorf("respstore: users line %d: name %q: 1 to 40 bytes of letters, digits and _.=-", n, u.Name)
		}
		if seen[u.Name] {
			return nil, fmt.Errorf("respstore: users line %d: %s listed twice", n, u.Name)
		}
		seen[u.Name] = true
		if len(f) == 3 {
			q, err := parseSize(f[2])
			if err != nil || q <= 0 {
				return nil, fmt.Errorf("respstore: users line %d: quota %q: want a positive size, e.g. 64GiB", n, f[2])
			}
			u.Quota = q
		}
		out = append(out, u)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("respstore: users: %w", err)
	}
	return out, nil
}

func validName(s string) bool {
	if len(s) == 0 || len(s) > 40 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-' || c == '=') {
			return false
		}
	}
	return true
}

func parseSize(s string) (int64, error) {
	lower := strings.ToLower(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40}, {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12}, {"b", 1}} {
		if strings.HasSuffix(lower, u.suffix) {
			s, mult = s[:len(s)-len(u.suffix)], u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("bad size")
	}
	return n * mult, nil
}

// accounts decides who a client is: with users, one of them; without,
// any credentials name a tenant of their own, the hash of the
// credentials (as the HTTP side hashes the bearer key), and no secret is
// kept.
type accounts struct {
	users map[string]user // nil: any credentials
}

type user struct {
	sum   [32]byte // of the password
	quota int64
}

func newAccounts(us []User) *accounts {
	if us == nil {
		return &accounts{}
	}
	a := &accounts{users: map[string]user{}}
	for _, u := range us {
		a.users[u.Name] = user{sum: sha256.Sum256([]byte(u.Password)), quota: u.Quota}
	}
	return a
}

// authenticate returns the tenant that name and password (name "" or
// "default" for AUTH with a password alone) open, and whether they do.
func (a *accounts) authenticate(name, password []byte) (string, bool) {
	if len(password) == 0 {
		return "", false
	}
	if a.users == nil {
		h := sha256.New()
		if len(name) > 0 && string(name) != "default" {
			h.Write(name)
			h.Write([]byte{0})
		}
		h.Write(password)
		return "t_" + hex.EncodeToString(h.Sum(nil)[:8]), true
	}
	n := string(name)
	if n == "" {
		n = "default"
	}
	u, ok := a.users[n]
	sum := sha256.Sum256(password)
	if subtle.ConstantTimeCompare(sum[:], u.sum[:]) != 1 || !ok {
		return "", false
	}
	return "u_" + n, true
}

// quota returns a tenant's own quota (users file), 0 when it has none.
func (a *accounts) quota(tenant string) int64 {
	if a.users == nil {
		return 0
	}
	if n, ok := strings.CutPrefix(tenant, "u_"); ok {
		return a.users[n].quota
	}
	return 0
}
