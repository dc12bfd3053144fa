// lmcache_native_driver drives LMCache's own native RESP connector
// (csrc/storage_backends/redis/: RedisConnector over ConnectorBase, the
// `resp` L2 adapter of LMCache's multiprocess mode) against a RESP server,
// through the interface LMCache's Python adapter calls (submit_batch_*,
// event_fd, drain_completions). scripts/lmcache-native.sh builds it with
// LMCache's sources and runs it against the sidecar's --resp-listen and a
// redis-server.
//
// usage: [TENANTS=1] driver HOST PORT USER PASSWORD WORKERS CHUNK_MIB CHUNKS [SALT]
// Prints one line of JSON; exits non-zero on any mismatch. TENANTS=1 also
// checks that other credentials find none of the keys.
#include "connector.h"

#include <poll.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using lmcache::connector::Completion;
using lmcache::connector::RedisConnector;

static Completion wait_for(RedisConnector& c, uint64_t id) {
  for (;;) {
    pollfd p{c.event_fd(), POLLIN, 0};
    if (::poll(&p, 1, 120000) <= 0) {
      std::fprintf(stderr, "no completion for future %llu in 120 s\n",
                   (unsigned long long)id);
      std::exit(2);
    }
    for (auto& comp : c.drain_completions()) {
      if (comp.future_id == id) return comp;
    }
  }
}

static void fail(const std::string& what) {
  std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  std::exit(1);
}

static double secs_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t)
      .count();
}

int main(int argc, char** argv) {
  if (argc < 8) {
    std::fprintf(stderr,
                 "usage: %s HOST PORT USER PASSWORD WORKERS CHUNK_MIB CHUNKS "
                 "[SALT]\n",
                 argv[0]);
    return 2;
  }
  std::string host = argv[1], user = argv[3], pass = argv[4];
  int port = std::atoi(argv[2]), workers = std::atoi(argv[5]);
  size_t chunk = size_t(std::atoi(argv[6])) << 20;
  int n = std::atoi(argv[7]);
  std::string salt = argc > 8 ? argv[8] : "";

  // Keys as NativeConnectorL2Adapter._object_key_to_string writes them:
  // model@kv_rank:08x@object_group_id:x@chunk_hash.hex()[@cache_salt].
  std::mt19937_64 rng(34);
  std::vector<std::string> keys;
  for (int i = 0; i < n; i++) {
    char hash[65];
    for (int j = 0; j < 4; j++)
      std::snprintf(hash + 16 * j, 17, "%016llx", (unsigned long long)rng());
    char k[256];
    std::snprintf(k, sizeof k, "meta-llama/Llama-3.1-70B-Instruct@%08x@%x@%s",
                  i % 8, 0, hash);
    keys.push_back(salt.empty() ? std::string(k) : std::string(k) + "@" + salt);
  }
  std::vector<std::vector<char>> in(n, std::vector<char>(chunk)),
      out(n, std::vector<char>(chunk));
  for (auto& b : in)
    for (size_t j = 0; j < chunk; j += 8) {
      uint64_t x = rng();
      std::memcpy(&b[j], &x, std::min<size_t>(8, chunk - j));
    }
  std::vector<void*> inp, outp;
  std::vector<size_t> lens(n, chunk);
  for (int i = 0; i < n; i++) {
    inp.push_back(in[i].data());
    outp.push_back(out[i].data());
  }

  RedisConnector c(host, port, workers, user, pass);

  Completion e = wait_for(c, c.submit_batch_exists(keys));
  if (!e.ok) fail("exists: " + e.error);
  for (auto r : e.result_bytes)
    if (r != 0) fail("a fresh key exists");

  auto t = std::chrono::steady_clock::now();
  Completion s = wait_for(c, c.submit_batch_set(keys, inp, lens, chunk));
  double set_s = secs_since(t);
  if (!s.ok) fail("set: " + s.error);

  e = wait_for(c, c.submit_batch_exists(keys));
  if (!e.ok) fail("exists: " + e.error);
  for (auto r : e.result_bytes)
    if (r != 1) fail("a stored key is missing");

  t = std::chrono::steady_clock::now();
  Completion g = wait_for(c, c.submit_batch_get(keys, outp, lens, chunk));
  double get_s = secs_since(t);
  if (!g.ok) fail("get: " + g.error);
  for (int i = 0; i < n; i++) {
    if (g.result_bytes[i] != 1) fail("get of a stored key failed");
    if (std::memcmp(in[i].data(), out[i].data(), chunk) != 0)
      fail("a value came back with other bytes");
  }

  // Missing keys between present ones: a nil reply per miss, and each
  // worker's connection stays in step for the keys after it.
  std::vector<std::string> mixed;
  std::vector<void*> mixedp;
  for (int i = 0; i < n; i++) {
    mixed.push_back(i % 2 ? keys[i] : keys[i] + "-missing");
    mixedp.push_back(out[i].data());
  }
  g = wait_for(c, c.submit_batch_get(mixed, mixedp, lens, chunk));
  for (int i = 0; i < n; i++)
    if (g.result_bytes[i] != (i % 2 ? 1 : 0)) fail("mixed get: wrong result");
  for (int i = 1; i < n; i += 2)
    if (std::memcmp(in[i].data(), out[i].data(), chunk) != 0)
      fail("mixed get: a value with other bytes");

  // Eviction: delete the first half.
  std::vector<std::string> half(keys.begin(), keys.begin() + n / 2);
  Completion d = wait_for(c, c.submit_batch_delete(half));
  for (auto r : d.result_bytes)
    if (r != 1) fail("delete of a stored key answered 0");
  d = wait_for(c, c.submit_batch_delete(half));
  for (auto r : d.result_bytes)
    if (r != 0) fail("delete of a deleted key answered 1");
  e = wait_for(c, c.submit_batch_exists(keys));
  for (int i = 0; i < n; i++)
    if (e.result_bytes[i] != (i < n / 2 ? 0 : 1)) fail("exists after delete");

  // Another deployment (other credentials) finds none of them: with
  // TENANTS=1 (a server where any credentials open a tenant: the sidecar).
  const char* tenants = std::getenv("TENANTS");
  if (tenants && std::string(tenants) == "1") {
    RedisConnector other(host, port, 2, user, pass + "-other");
    e = wait_for(other, other.submit_batch_exists(keys));
    if (!e.ok) fail("other: exists: " + e.error);
    for (auto r : e.result_bytes)
      if (r != 0) fail("another tenant found a key");
  }

  double gb = double(chunk) * n / 1e9;
  std::printf(
      "{\"ok\":true,\"workers\":%d,\"chunk_mib\":%zu,\"chunks\":%d,"
      "\"set_gb_per_s\":%.3f,\"get_gb_per_s\":%.3f}\n",
      workers, chunk >> 20, n, gb / set_s, gb / get_s);
  return 0;
}
