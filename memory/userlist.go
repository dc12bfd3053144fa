package memory

import (
	"os"
	"slices"
	"time"

	"github.com/kvsidecar/kvsidecar/memory/internal/userlist"
)

// The users' session lists (package memory/internal/userlist owns the
// files): a user's list names its sessions, so loading the user's memory
// reads only them. Sessions private when created (no end user,
// Recall.TenantUserScope off) are listed only by a tenant's first scan.

// userListPath is the session list of the user whose index is at
// indexPath.
func userListPath(indexPath string) string { return userlist.Path(indexPath) }

// listSession adds a new session to its user's list, unless it is
// private. Called on the request path before the session's log is
// created: the write is not fsynced there (a crash of the process keeps
// it); the worker fsyncs it right after the turn (lists.Sync), unless
// FsyncNever.
func (us *userScope) listSession(tenant, user, id string) error {
	if us.private(user) {
		return nil
	}
	if err := us.lists.Add(userListPath(userIndexPath(us.opts.Dir, tenant, user)), id); err != nil {
		return err
	}
	us.reg.mu.Lock()
	um := us.reg.users[tenant+"\x00"+user]
	us.reg.mu.Unlock()
	if um != nil {
		um.mu.Lock()
		um.listed = append(um.listed, id) // before listRead: merged by userListed
		um.mu.Unlock()
	}
	return nil
}

// userListed returns the ids of the user's session list, reading it on
// first use (after listing the tenant's sessions once, ListTenant).
func (us *userScope) userListed(um *userMem) []string {
	um.mu.Lock()
	ids, ok := um.listed, um.listRead
	um.mu.Unlock()
	if ok {
		return ids
	}
	us.lists.ListTenant(um.tenantDir, um.tenant, func(user string) string {
		return userListPath(userIndexPath(us.opts.Dir, um.tenant, user))
	})
	path := userListPath(um.path)
	ids, err := us.lists.Read(path)
	if err != nil {
		us.opts.Logger.Warn("memory: user session list unreadable, listing the tenant's logs", "err", err)
		ids = us.lists.Scan(um.tenantDir, um.tenant, um.user)
		if err := us.lists.Replace(path, ids); err != nil {
			us.opts.Logger.Warn("memory: rewrite user session list", "err", err)
		}
	}
	um.mu.Lock()
	defer um.mu.Unlock()
	if !um.listRead {
		// Appends that raced with the read are in the file and, after
		// listRead, in listed: keep both, deduplicated.
		seen := make(map[string]bool, len(ids))
		for _, id := range ids {
			seen[id] = true
		}
		for _, id := range um.listed {
			if !seen[id] {
				ids = append(ids, id)
			}
		}
		um.listed, um.listRead = ids, true
	}
	return um.listed
}

// listUserSessions returns the ids of the user's sessions whose log
// changed after since (all of them when since is zero), from the user's
// list; it rewrites a list that names more deleted sessions than live
// ones.
func (us *userScope) listUserSessions(um *userMem, since time.Time) []string {
	ids := us.userListed(um)
	var live, changed []string
	for _, id := range ids {
		fi, err := os.Stat(sessionPath(us.opts.Dir, um.tenant, id))
		if err != nil {
			continue
		}
		live = append(live, id)
		if since.IsZero() || fi.ModTime().After(since) {
			changed = append(changed, id)
		}
	}
	if dead := len(ids) - len(live); dead > 16 && dead > len(live) {
		drop := map[string]bool{}
		for _, id := range ids {
			drop[id] = true
		}
		for _, id := range live {
			delete(drop, id)
		}
		if err := us.lists.Drop(userListPath(um.path), drop); err != nil {
			us.opts.Logger.Warn("memory: rewrite user session list", "err", err)
		} else {
			um.mu.Lock()
			um.listed = slices.DeleteFunc(um.listed, func(id string) bool { return drop[id] })
			um.mu.Unlock()
		}
	}
	return changed
}
