#include "ffi/runtime/watchdog.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace jss {
namespace {

// Strings are built without iostreams (see mpi_comm.cc: a statically linked
// libstdc++ without locales crashed on `ostream << int`).
std::string fmt_seconds(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ns) * 1e-9);
  return buf;
}

int64_t mono_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Wall clock: comparable between processes (and, with NTP, between nodes).
int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

struct CommRecord {
  int64_t entered = 0;      // operations entered on this communicator (the last one's number)
  bool last_done = false;   // whether the last one entered has completed
  const char* last_op = "-";  // name of the last one entered
  bool members_known = false;
  std::vector<int> members;  // world ranks, in communicator rank order
  // Names the communicator alike on every rank (Fortran handles differ between
  // ranks): a hash of its members and how many communicators with the same
  // members this process used before it (ranks use communicators in one order).
  std::string key = "?";
};

struct ActiveOp {
  const char* op;
  int64_t comm;
  int64_t seq;
  int64_t start_mono;
  int64_t deadline_mono;
  int64_t timeout_ns;
};

struct State {
  std::atomic<int64_t> timeout_ns{0};
  std::mutex mu;
  std::condition_variable wake;
  int exit_code = 1;
  std::string tag = "cpu";
  std::unordered_map<int64_t, CommRecord> comms;  // by Fortran handle
  std::map<uint64_t, int> communicators_with_members;  // member hash -> how many seen
  std::map<int64_t, ActiveOp> active;  // token -> operation in flight
  std::unordered_map<int64_t, int64_t> duplicates;  // a library-made duplicate -> its original
  int64_t next_token = 0;
  int64_t entered_total = 0;
  // The last operation entered, over all communicators.
  const char* last_op = "-";
  int64_t last_comm = 0, last_seq = 0, last_wall = 0;
  bool last_done = false;
  std::string last_key = "?";
  // The record file.
  int fd = -1;
  bool file_failed = false;
  size_t file_len = 0;
  std::string dir;
  int world_rank = -1;
  bool watcher_started = false;
  bool dirty = false;  // the record file lags the state: the watcher rewrites it
  bool fired = false;
};

// Never destroyed: the watcher thread may outlive static destruction.
State& state() {
  static State* s = new State;
  return *s;
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string resolve_directory() {
  std::string dir = env_or_empty("JSS_WATCHDOG_DIR");
  if (!dir.empty()) return dir;
  // A name every rank of this job (on this node) derives alike without talking.
  std::string job = env_or_empty("SLURM_JOB_ID");
  if (!job.empty()) {
    std::string step = env_or_empty("SLURM_STEP_ID");
    if (!step.empty()) job += "." + step;
  }
  if (job.empty()) job = env_or_empty("PMIX_NAMESPACE");
  if (job.empty()) job = env_or_empty("OMPI_MCA_orte_ess_jobid");
  if (job.empty()) job = env_or_empty("PBS_JOBID");
  // MPICH's hydra names no job: its per-node proxy (our parent) is unique to the job.
  if (job.empty()) job = "ppid" + std::to_string(static_cast<long long>(getppid()));
  for (char& c : job) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) c = '_';
  }
  struct stat st;
  const char* base = (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode)) ? "/dev/shm" : "/tmp";
  return std::string(base) + "/jss-" + job;
}

int world_rank() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  int r = -1;
  if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}


std::string file_name(const std::string& dir, int rank, const std::string& tag) {
  return dir + "/rank" + std::to_string(rank) + "." + tag;
}

bool mpi_usable() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

// The world ranks of communicator `comm`, once per communicator (local MPI calls),
// learned at its first use even while off: the communicator is valid then.
void learn_members_locked(State& s, CommRecord& c, MPI_Comm comm) {
  if (c.members_known || !mpi_usable()) return;
  MPI_Group group, world;
  int n = 0;
  if (MPI_Comm_group(comm, &group) == MPI_SUCCESS &&
      MPI_Comm_group(MPI_COMM_WORLD, &world) == MPI_SUCCESS) {
    MPI_Group_size(group, &n);
    std::vector<int> ranks(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) ranks[i] = i;
    c.members.assign(static_cast<size_t>(n), -1);
    MPI_Group_translate_ranks(group, n, ranks.data(), world, c.members.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world);
  }
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the member list
  for (int r : c.members) h = (h ^ static_cast<uint64_t>(r + 1)) * 1099511628211ull;
  char key[48];
  std::snprintf(key, sizeof key, "%016llx.%d", static_cast<unsigned long long>(h),
                s.communicators_with_members[h]++);
  c.key = key;
  c.members_known = true;
}

// Rewrites this rank's record file (caller holds the lock). Best effort: a
// directory that cannot be written only makes the report name this rank alone.
void publish_locked(State& s) {
  if (s.file_failed) return;
  if (s.fd < 0) {
    if (s.dir.empty()) s.dir = resolve_directory();
    if (s.world_rank < 0) s.world_rank = world_rank();
    mkdir(s.dir.c_str(), 0777);  // EEXIST is fine: another rank made it
    const std::string path = file_name(s.dir, s.world_rank, s.tag);
    s.fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (s.fd < 0) {
      std::fprintf(stderr,
                   "jax_sparse_sync watchdog: cannot write %s (%s); a timeout will name only "
                   "this rank. Set JSS_WATCHDOG_DIR to a writable directory shared by the job.\n",
                   path.c_str(), std::strerror(errno));
      s.file_failed = true;
      return;
    }
    s.file_len = 0;
  }
  std::string text = "jss-watchdog 1\npid " + std::to_string(static_cast<long long>(getpid())) +
                     "\nlast " + s.last_op + " " + s.last_key + " " + std::to_string(s.last_seq) + " " +
                     (s.last_done ? "done" : "entered") + " " + std::to_string(s.last_wall) +
                     "\n";
  for (const auto& [handle, c] : s.comms) {
    if (!c.members_known) continue;
    text += "comm " + c.key + " " + std::to_string(c.entered) + " " + (c.last_done ? "1" : "0") + " " + std::string(c.last_op) + "\n";
  }
  text += "end\n";
  // Pad over a longer previous record instead of truncating: a reader never
  // sees an empty file.
  const size_t len = text.size();
  if (len < s.file_len) text.append(s.file_len - len, ' ');
  s.file_len = std::max(s.file_len, len);
  ssize_t written = pwrite(s.fd, text.data(), text.size(), 0);
  (void)written;
}

struct PeerRecord {
  bool found = false;
  std::string last_op = "-", last_key;
  int64_t last_seq = 0, last_wall = 0;
  bool last_done = false;
  bool has_comm = false;
  int64_t entered = 0;
  bool done = false;
  std::string comm_last_op;
};

// Reads every record file of world rank `rank` (one per module) and merges
// what they say about the communicator named `key`.
PeerRecord read_peer(const std::string& dir, int rank, const std::string& key) {
  PeerRecord p;
  for (const char* tag : {"cpu", "cuda"}) {
    const std::string path = file_name(dir, rank, tag);
    FILE* f = std::fopen(path.c_str(), "r");
    if (!f) continue;
    char line[512];
    while (std::fgets(line, sizeof line, f)) {
      char name[128], k[64];
      long long b = 0, c = 0, d = 0;
      char st[16];
      if (std::sscanf(line, "last %127s %63s %lld %15s %lld", name, k, &b, st, &c) == 5) {
        if (!p.found || c > p.last_wall) {
          p.last_op = name;
          p.last_key = k;
          p.last_seq = b;
          p.last_done = std::strcmp(st, "done") == 0;
          p.last_wall = c;
        }
        p.found = true;
      } else if (std::sscanf(line, "comm %63s %lld %lld %127s", k, &b, &d, name) == 4) {
        if (key == k && b >= p.entered) {
          p.has_comm = true;
          p.entered = b;
          p.done = d != 0;
          p.comm_last_op = name;
        }
      }
    }
    std::fclose(f);
  }
  return p;
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

// 4096 -> "4,096".
std::string with_commas(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (v < 0 ? "-" : "") + out;
}

// Communicator rank `peer` of the communicator `handle` as a world rank, where known.
std::string peer_name(State& s, int64_t handle, int peer) {
  auto it = s.duplicates.find(handle);
  if (it != s.duplicates.end()) handle = it->second;
  auto c = s.comms.find(handle);
  if (c != s.comms.end() && c->second.members_known && peer >= 0 &&
      peer < static_cast<int>(c->second.members.size())) {
    return "rank " + std::to_string(c->second.members[peer]);
  }
  return "rank " + std::to_string(peer) + " of its communicator";
}

// One thread's "waits for ..." line of the report (caller holds the lock).
// `members`: the world ranks of the operation's communicator (a collective's
// record names no communicator: it is the operation's, or a duplicate of it).
std::string describe_blocked(State& s, const BlockedSnapshot& b, int64_t now_mono,
                             const std::vector<int>& members) {
  std::string where = b.label;
  if (b.step >= 0) where += " " + std::to_string(b.step);
  const std::string in = where.empty() ? b.call : where + ", " + b.call;
  std::string line = "  rank " + std::to_string(s.world_rank) + " ";
  switch (b.kind) {
    case WaitKind::kRecv:
      line += "waits for a message from " + peer_name(s, b.comm, b.peer) + " (" + in + ", " +
              with_commas(b.bytes) + " B)";
      break;
    case WaitKind::kSend:
      line += "waits to hand a message to " + peer_name(s, b.comm, b.peer) + " (" + in + ", " +
              with_commas(b.bytes_out) + " B)";
      break;
    case WaitKind::kSendrecv:
      line += "waits for a message from " + peer_name(s, b.comm, b.peer) + " (" + in + ": " +
              with_commas(b.bytes) + " B expected, " + with_commas(b.bytes_out) +
              " B sent to it)";
      break;
    case WaitKind::kRequests: {
      std::string from, to;
      int n_from = 0, n_to = 0;
      for (const RequestPeer& r : b.listed) {
        std::string& list = r.send ? to : from;
        ++(r.send ? n_to : n_from);
        list += (list.empty() ? "" : ", ") + peer_name(s, b.comm, r.peer) + " (" +
                with_commas(r.bytes) + " B)";
      }
      std::string what;
      if (n_from) what += (n_from == 1 ? "for a message from " : "for messages from ") + from;
      if (n_to) {
        what += std::string(what.empty() ? "" : " and ") +
                (n_to == 1 ? "to hand a message to " : "to hand messages to ") + to;
      }
      if (b.pending > static_cast<int>(b.listed.size())) {
        what += " and " + std::to_string(b.pending - static_cast<int>(b.listed.size())) +
                " more requests";
      }
      if (what.empty()) what = "for its requests";
      line += "waits " + what + " (" + in + ")";
      break;
    }
    case WaitKind::kLocal:
      line += "waits for " + b.call + (where.empty() ? "" : " (" + where + ")");
      break;
    default: {
      std::vector<int> others;
      for (int r : members) {
        if (r != s.world_rank) others.push_back(r);
      }
      line += "waits in the collective " + b.call + (where.empty() ? "" : " (" + where + ")");
      if (others.size() == 1) {
        line += " with rank " + std::to_string(others[0]);
      } else {
        line += " with ranks " + join(others) +
                " (which of them is late cannot be seen from inside MPI's collective)";
      }
      break;
    }
  }
  return line + ", for " + fmt_seconds(now_mono - b.since_ns) + "\n";
}

// Builds the report for the operation that timed out (caller holds the lock).
std::string report_locked(State& s, const ActiveOp& op) {
  const CommRecord& c = s.comms[op.comm];
  const int64_t now_m = mono_ns(), now_w = wall_ns();
  const std::string me = std::to_string(s.world_rank);
  std::string msg = "jax_sparse_sync watchdog: rank " + me + " (pid " +
                    std::to_string(static_cast<long long>(getpid())) + "): `" + op.op + "` #" +
                    std::to_string(op.seq) + " on the communicator of world ranks " +
                    join(c.members) + " has not completed " +
                    fmt_seconds(now_m - op.start_mono) + " after this rank entered it (timeout " +
                    fmt_seconds(op.timeout_ns) + ", set by JSS_TIMEOUT_S or jss.set_timeout).\n";
  std::vector<int> missing, arrived, unknown;
  std::string details;
  for (int r : c.members) {
    if (r == s.world_rank) continue;
    PeerRecord p = read_peer(s.dir, r, c.key);
    if (!p.found) {
      unknown.push_back(r);
      continue;
    }
    const bool here = p.has_comm && p.entered >= op.seq;
    (here ? arrived : missing).push_back(r);
    std::string line = "  rank " + std::to_string(r) + ": ";
    if (p.has_comm) {
      line += "last entered `" + p.comm_last_op + "` #" + std::to_string(p.entered) +
              " on this communicator (" + (p.done ? "completed" : "in progress") + ")";
    } else {
      line += "entered nothing on this communicator";
    }
    line += "; its last entry of all: `" + p.last_op + "` #" + std::to_string(p.last_seq) +
            (p.last_key == c.key ? " on this communicator" : " on another communicator") + ", " +
            (p.last_done ? "completed" : "in progress") + ", " +
            fmt_seconds(now_w - p.last_wall) + " ago\n";
    details += line;
  }
  if (!missing.empty()) {
    msg += "  ranks that have not entered #" + std::to_string(op.seq) + ": " + join(missing) +
           " (stuck in computation, or calling something else)\n";
  } else if (unknown.empty()) {
    msg += "  every rank entered #" + std::to_string(op.seq) +
           ": it is stuck inside the operation (a message lost, a link down?)\n";
  }
  if (!arrived.empty()) msg += "  ranks waiting in it too: " + join(arrived) + "\n";
  if (!unknown.empty()) {
    msg += "  ranks with no record in " + s.dir + ": " + join(unknown) +
           " (on another node? set JSS_WATCHDOG_DIR to a directory the whole job shares)\n";
  }
  msg += details;
  // Where this rank's threads wait: with every rank inside the operation (a
  // link down, a message lost), the peer whose message is missing.
  const std::vector<BlockedSnapshot> blocked = blocked_snapshots();
  for (const BlockedSnapshot& b : blocked) msg += describe_blocked(s, b, now_m, c.members);
  if (blocked.empty()) {
    msg += "  rank " + me + " is in no MPI call of the library (computing, or between calls)\n";
  }
  return msg;
}

[[noreturn]] void fire(const std::string& message, int exit_code) {
  std::fprintf(stderr, "%sEnding the job: MPI_Abort(MPI_COMM_WORLD, %d).\n", message.c_str(),
               exit_code);
  std::fflush(stderr);
  // The launcher forwards output asynchronously and MPI_Abort kills at once
  // (the same grace as jss.abort_on_error).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  int init = 0, fin = 0, provided = MPI_THREAD_SINGLE;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) {
    MPI_Query_thread(&provided);
    // From a thread of our own only where MPI allows it; otherwise an abnormal exit, which
    // the launcher also answers by killing every rank.
    if (provided == MPI_THREAD_MULTIPLE) MPI_Abort(MPI_COMM_WORLD, exit_code);
  }
  std::_Exit(exit_code);
}

void watcher_loop() {
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mu);
  while (true) {
    const int64_t t = s.timeout_ns.load(std::memory_order_relaxed);
    // Poll at a twentieth of the timeout: detection within timeout * 1.05 (+ 10 ms).
    int64_t poll = t > 0 ? std::clamp<int64_t>(t / 20, 10'000'000, 500'000'000) : 500'000'000;
    s.wake.wait_for(lock, std::chrono::nanoseconds(poll));
    if (s.dirty) {  // at most one rewrite per poll, off the collectives' path
      publish_locked(s);
      s.dirty = false;
    }
    const int64_t now = mono_ns();
    const ActiveOp* late = nullptr;
    for (const auto& [token, op] : s.active) {
      if (now >= op.deadline_mono && (!late || op.deadline_mono < late->deadline_mono)) late = &op;
    }
    if (late && !s.fired) {
      s.fired = true;
      const std::string message = report_locked(s, *late);
      const int code = s.exit_code;
      lock.unlock();
      fire(message, code);
    }
  }
}

}  // namespace

void watchdog_set_timeout_ns(int64_t ns) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.timeout_ns.store(std::max<int64_t>(ns, 0), std::memory_order_relaxed);
  if (ns > 0 && !s.watcher_started) {
    s.watcher_started = true;
    std::thread(watcher_loop).detach();
  }
  if (ns > 0 && mpi_usable()) {
    // Publish at once what this rank did while the watchdog was off: a rank that
    // stops before its next collective is then still described to the others.
    publish_locked(s);
  }
  s.wake.notify_all();
}

int64_t watchdog_timeout_ns() { return state().timeout_ns.load(std::memory_order_relaxed); }

void watchdog_set_exit_code(int code) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.exit_code = code;
}

void watchdog_set_module_tag(const std::string& tag) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.tag = tag;
}

std::string watchdog_directory() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.dir.empty() ? resolve_directory() : s.dir;
}

void watchdog_remove_record() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.fd < 0) return;
  close(s.fd);
  s.fd = -1;
  s.file_failed = true;  // nothing more is written by this process
  unlink(file_name(s.dir, s.world_rank, s.tag).c_str());
  rmdir(s.dir.c_str());  // fails while other ranks' records remain: fine
}

int64_t watchdog_entered_count() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.entered_total;
}

WatchdogTicket watchdog_enter(const char* op, int64_t comm_handle, MPI_Comm comm) {
  State& s = state();
  const int64_t t = s.timeout_ns.load(std::memory_order_relaxed);
  const int64_t wall = wall_ns();
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.entered_total;
  CommRecord& c = s.comms[comm_handle];
  // Kept even when off: numbers agree across ranks, and a record published
  // when the watchdog is turned on says what this rank did before.
  WatchdogTicket ticket{comm_handle, ++c.entered, -1};
  c.last_op = op;
  c.last_done = false;
  s.last_op = op;
  s.last_comm = comm_handle;
  s.last_seq = ticket.seq;
  s.last_done = false;
  s.last_wall = wall;
  learn_members_locked(s, c, comm);  // once per communicator (not per call): it stays valid
  s.last_key = c.key;
  if (t <= 0) return ticket;
  const int64_t now = mono_ns();
  ticket.token = s.next_token++;
  s.active[ticket.token] = ActiveOp{op, comm_handle, ticket.seq, now, now + t, t};
  s.dirty = true;  // no file write here: a pwrite per call cost 6-9 us (measured)
  return ticket;
}

void watchdog_exit(const WatchdogTicket& ticket) {
  State& s = state();
  const int64_t wall = wall_ns();
  std::lock_guard<std::mutex> lock(s.mu);
  CommRecord& c = s.comms[ticket.comm];
  if (c.entered == ticket.seq) c.last_done = true;
  if (s.last_comm == ticket.comm && s.last_seq == ticket.seq) {
    s.last_done = true;
    s.last_wall = wall;
  }
  if (ticket.token < 0) return;  // not timed (entered while off)
  s.active.erase(ticket.token);
  s.dirty = true;
}

double watchdog_pair_cost_ns(int64_t comm_handle, int64_t iterations) {
  MPI_Comm comm = MPI_Comm_f2c(static_cast<MPI_Fint>(comm_handle));
  const int64_t t0 = mono_ns();
  for (int64_t i = 0; i < iterations; ++i) {
    watchdog_exit(watchdog_enter("watchdog_benchmark", comm_handle, comm));
  }
  return static_cast<double>(mono_ns() - t0) / static_cast<double>(std::max<int64_t>(iterations, 1));
}

void watchdog_note_duplicate(int64_t dup_handle, int64_t original_handle, MPI_Comm original) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  learn_members_locked(s, s.comms[original_handle], original);
  s.duplicates[dup_handle] = original_handle;
}

namespace blocked_detail {

// JSS_TEST_FREEZE_AT="<world rank>:<text>": for tests of the report (a rank
// that stops inside an operation, as behind a dead link, without root). The
// first time that rank, with the watchdog on, begins a recorded MPI call whose
// "<label> <call>" contains <text>, it publishes its record and stops itself
// with SIGSTOP. Inert (one relaxed load per call) unless the variable is set.
std::atomic<bool> freeze_armed{std::getenv("JSS_TEST_FREEZE_AT") != nullptr};

void freeze_point(const BlockedSlot* slot) {
  State& s = state();
  if (s.timeout_ns.load(std::memory_order_relaxed) <= 0) return;
  const char* spec = std::getenv("JSS_TEST_FREEZE_AT");
  const char* colon = spec ? std::strchr(spec, ':') : nullptr;
  if (colon == nullptr) return;
  const char* label = slot->label.load(std::memory_order_relaxed);
  const char* call = slot->call.load(std::memory_order_relaxed);
  const std::string where = std::string(label ? label : "") + " " + (call ? call : "");
  if (std::atoi(spec) != world_rank() || where.find(colon + 1) == std::string::npos) return;
  bool armed = true;
  if (!freeze_armed.compare_exchange_strong(armed, false)) return;  // once
  {
    std::lock_guard<std::mutex> lock(s.mu);
    publish_locked(s);  // the others' reports show that this rank entered the operation
  }
  std::fprintf(stderr, "JSS_TEST_FREEZE_AT: rank %d stops itself (SIGSTOP) before %s\n",
               world_rank(), where.c_str());
  std::fflush(stderr);
  raise(SIGSTOP);
}

}  // namespace blocked_detail

WatchdogScope::WatchdogScope(const char* op, MPI_Comm comm)
    : ticket_(watchdog_enter(op, static_cast<int64_t>(MPI_Comm_c2f(comm)), comm)) {}

}  // namespace jss
