// Package userlist owns the users' session lists of package memory. Loading
// a user's memory needs the user's sessions; finding them by reading the
// meta record of every log of the tenant made loading cost linear in the
// tenant's sessions — with each session its own user, every new session
// read every log (issue 22). Each user that has a cross-session index
// therefore has a list of its session ids beside the index,
// <user hash>.usess: the magic "KVSUSES1", then one framed record
// (durable.AppendRecord) per session, its id as a JSON string, appended
// when the session is created and before its log is, so a session with a
// log is listed.
//
// Invariants: appends are single O_APPEND writes and never wait for each
// other; a rewrite (Replace, Drop) is atomic and appends wait for it, so
// none is lost. The request path does not wait for an append's fsync: the
// owner calls Sync after the turn (unless Options.NoSync), so only a power
// loss in between can lose an entry. A torn record is skipped when read
// (records resynchronise); an id may appear twice and is read once.
//
// Data written before the lists existed: the first user loaded in a tenant
// whose users folder holds no listedMarker lists every session of the
// tenant by its log's meta record (ListTenant, once per process), then
// writes the marker. A list that cannot be read is rebuilt the same way
// (Scan), for its user only. Lists holds its locks and no goroutine.
package userlist
