// Package launch runs one server process for tests and benchmarks: on a free
// loopback port, restartable on that same port, with its output captured
// in a log file. It is the launcher under bench/harness/llamaserver and
// bench/harness/redisserver.
//
//   - Start picks a free port, runs the binary with the arguments
//     Options.Args gives for that port and polls Options.Ready (bounded by
//     StartTimeout) until the server answers. A port taken between the
//     probe and the server's bind (Options.BindError in the log) is retried
//     on another, a few times. On Linux an answer counts only once the
//     child itself holds the listening socket (/proc/net/tcp and the
//     child's fds): many tests start servers at once, and another one may
//     take the port, above all while a child is down between Kill and
//     Restart; the launcher never reports a stranger's server as its own.
//   - Kill sends SIGKILL, Stop SIGTERM (then SIGKILL after 10 s); Restart
//     starts the binary again on the same port, asking Options.Args again
//     (so a caller may change what it serves).
//
// Invariants: a Process owns its child and the one goroutine that reaps
// it; Kill, Stop, Restart and Close return only after the previous child
// is reaped. On Linux a child started with SysProcAttr also gets SIGKILL
// when the thread that started it dies (Pdeathsig), so a crashed test or
// benchmark leaves no server behind.
package launch
