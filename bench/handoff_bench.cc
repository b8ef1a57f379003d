// loaderx_handoff_bench: the C++ client's batch hand-off, measured where it
// is decided (bench/bench_daemon.py starts loaderxd and runs this; results in
// docs/benchmarks.md, section "loaderxd").
//
//   loaderx_handoff_bench --socket PATH --store DIR --batch N [--samples N]
//                         [--pause-ms F] [--warm-us N] [--socket-push]
//   loaderx_handoff_bench --socket PATH --store DIR --batch N --throughput N
//                         [--work-us N]
//   loaderx_handoff_bench --calibrate [--samples N] [--pause-ms F]
//
// Prints one JSON object of raw microsecond samples (the caller computes the
// percentiles). Clocks: CLOCK_MONOTONIC (the clock of the slot's publish_ns
// stamp, system-wide) and CLOCK_THREAD_CPUTIME_ID for the call's own CPU.
//
// Regimes, each of a batch the daemon's pipeline already has (protocol 1.2:
// the daemon pushes batches while the client holds fewer than its credit):
//  * credit: the client holds its whole credit (nothing is pushed), then
//            frees one batch and takes the next: release -> daemon wake-up
//            -> push -> receive, decode, checks, views. round_trip = from
//            the release; publish_to_holding = from the later of the
//            release and the slot's publish stamp (reply_cpu: the call's CPU).
//  * queued: the batch was pushed while the client slept --pause-ms (cold,
//            as bench_daemon.py's Python draws): the receive side alone,
//            the caller holding its previous batch through the call as a
//            training loop does (its take is reported with that batch's
//            release, after the call); queued_bare: the same holding
//            nothing (the take is reported inside the call).
//  * warm:   as queued, but after the sleep the client computes (busy-waits)
//            for --warm-us (default 3 ms) before the call, as a training
//            step does: the core is awake and ours, the same at every size.
// --socket-push opens the loader without a push queue (protocol 1.3's path:
// each pushed batch is a frame on the socket), for the comparison.
// A queued/warm draw whose batch was published after the call began was not
// ready (production, not hand-off): it is redrawn, counted in "skipped".
//
// --throughput N draws N batches back to back, the caller busy for
// --work-us per batch (a training step on the CPU), and reports batches/s
// and this thread's CPU per batch: what the daemon's gather priority costs
// or gives when the consumer competes for the same cores.
//
// --calibrate measures the floor under any socket design on this machine,
// with no loaderx code on the path: a forked process sends a 200-byte
// SEQPACKET message while this one is blocked in recvmsg (wake), or after
// this one slept (queued_cold recvmsg), and the warm per-stage costs of the
// client's NextUntil (RecvFrame of a queued frame, DecodeMessage of a batch
// message, CheckSlot, SendFrame of the `release` that returns credit).
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "loaderx/client.h"
#include "loaderx/loader.h"
#include "loaderx/ring.h"
#include "loaderx/sampler.h"
#include "loaderx/store.h"
#include "loaderx/unix_socket.h"
#include "loaderx/wire.h"

namespace {

using loaderx::MonotonicNowNs;
using loaderx::Status;
using Samples = std::vector<double>;

constexpr uint64_t kSeed = 7;
constexpr int kVerifySteps = 3;

struct Args {
  std::string socket;
  std::string store;
  uint64_t batch = 0;
  int samples = 300;
  double pause_ms = 80;
  double warm_us = 3000;
  int throughput = 0;
  double work_us = 0;
  bool calibrate = false;
  bool socket_push = false;  // --socket-push: batches on the socket (no push queue)
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "loaderx_handoff_bench: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T Check(loaderx::Result<T> r, const char* what) {
  if (!r.ok()) Die(std::string(what) + ": " + r.status().ToString());
  return std::move(r).value();
}

void Check(const Status& st, const char* what) {
  if (!st.ok()) Die(std::string(what) + ": " + st.ToString());
}

uint64_t ThreadCpuNs() {
  timespec ts;
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

void SleepMs(double ms) {
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

void BusyWaitUs(double us) {
  const uint64_t end = MonotonicNowNs() + static_cast<uint64_t>(us * 1e3);
  while (MonotonicNowNs() < end) {
  }
}

double Us(uint64_t from, uint64_t to) { return (double(to) - double(from)) / 1e3; }

// Bytes of dense stream 0 (the only stream this bench opens).
uint64_t DenseBytes(const loaderx::client::Batch& b) {
  loaderx::client::ArrayView v = b.Dense(0);
  uint64_t n = v.itemsize;
  for (uint64_t d : v.shape) n *= d;
  return n;
}

// The next batch through the seam (NextUntil), read through client::Batch.
loaderx::client::Batch Take(loaderx::client::Loader& loader, const char* what) {
  std::optional<loaderx::BatchView> v =
      Check(loader.NextUntil(loaderx::BatchSource::Clock::time_point::max()), what);
  if (!v) Die(std::string(what) + ": no batch without a deadline");
  return loaderx::client::Batch(std::move(*v), loader);
}

// Every bench batch is compared with the embedded pipeline's for the same
// steps before anything is timed: a fast wrong hand-off is worthless.
void VerifyAgainstEmbedded(loaderx::client::Loader& loader, const std::string& store,
                           uint64_t batch) {
  auto s = Check(loaderx::Store::Open(store), "open store");
  loaderx::SamplerSpec spec;
  spec.n = s->size();
  spec.batch_size = batch;
  spec.mode = loaderx::SamplerMode::kIID;
  spec.seed = kSeed;
  auto pipe =
      Check(loaderx::Pipeline::Create({s}, spec, loaderx::PipelineOptions{}), "embedded pipeline");
  const loaderx::StreamInfo& info = pipe->streams()[0];
  uint64_t want_bytes = batch * info.itemsize;
  for (uint64_t d : info.item_shape) want_bytes *= d;
  for (int i = 0; i < kVerifySteps; ++i) {
    std::optional<loaderx::BatchView> want =
        Check(pipe->NextUntil(loaderx::BatchSource::Clock::now() + std::chrono::minutes(1)),
              "embedded next");
    if (!want) Die("the embedded batch took more than a minute");
    loaderx::client::Batch got = Take(loader, "daemon next");
    const uint64_t bytes = DenseBytes(got);
    if (got.step() != want->step || bytes != want_bytes ||
        std::memcmp(got.Dense(0).data, want->streams[0].values, bytes) != 0) {
      Die("daemon batch of step " + std::to_string(got.step()) + " differs from embedded");
    }
  }
  pipe->Close();
}

// One timed draw of a batch that should already be in the socket. False if
// it was published after the call began (not ready: redraw). With `held`,
// the caller keeps its previous batch through the call and drops it after,
// as a training loop does (`for (;;) { b = Take(loader); ... }`, or Python's
// `for batch in loader`): the client then reports the take with that
// batch's release, after the clock stopped (docs/protocol.md "Consumed
// positions"). Without it the caller holds nothing during the call, and the
// take is reported inside the call.
bool TimedQueuedDraw(loaderx::client::Loader& loader, std::optional<loaderx::client::Batch>* held,
                     Samples* wall, Samples* cpu) {
  const uint64_t c0 = ThreadCpuNs(), t0 = MonotonicNowNs();
  loaderx::client::Batch b = Take(loader, "next");
  loaderx::client::ArrayView v = b.Dense(0);  // holding the views: hand-off complete
  const uint64_t t1 = MonotonicNowNs(), c1 = ThreadCpuNs();
  if (v.data == nullptr) Die("batch without values");
  const bool ready = b.publish_ns() < t0;
  if (held != nullptr) *held = std::move(b);  // the previous batch goes now, untimed
  if (!ready) return false;
  wall->push_back(Us(t0, t1));
  cpu->push_back(Us(c0, c1));
  return true;
}

void PrintSamples(const char* name, const Samples& s, bool last = false) {
  std::printf("\"%s\": [", name);
  for (size_t i = 0; i < s.size(); ++i) std::printf(i ? ",%.3f" : "%.3f", s[i]);
  std::printf("]%s\n", last ? "" : ",");
}

int RunThroughput(const Args& a, loaderx::client::Loader& loader) {
  for (int i = 0; i < 3; ++i) (void)Take(loader, "next");
  const uint64_t c0 = ThreadCpuNs(), t0 = MonotonicNowNs();
  for (int i = 0; i < a.throughput; ++i) {
    loaderx::client::Batch b = Take(loader, "next");
    if (b.Dense(0).data == nullptr) Die("batch without values");
    BusyWaitUs(a.work_us);
  }
  const uint64_t t1 = MonotonicNowNs(), c1 = ThreadCpuNs();
  loader.Close();
  std::printf(
      "{\"batches\": %d, \"batches_per_s\": %.3f, \"cpu_ms_per_batch\": %.4f,"
      " \"work_us\": %.1f}\n",
      a.throughput, a.throughput / (Us(t0, t1) / 1e6), Us(c0, c1) / 1e3 / a.throughput, a.work_us);
  return 0;
}

// The pause before a timed draw: a few of the daemon's steady production
// times per batch (back to back, prefetch drained), so that every timed draw
// finds its batch ready, or --pause-ms if longer (one pause for every size,
// so a size dependence is not a difference in how cold the caches got).
double PauseMs(loaderx::client::Loader& loader, double min_pause_ms, uint64_t* nbytes) {
  for (int i = 0; i < 3; ++i) *nbytes = DenseBytes(Take(loader, "next"));
  const uint64_t p0 = MonotonicNowNs();
  for (int i = 0; i < 8; ++i) (void)Take(loader, "next");
  const double produce_ms = Us(p0, MonotonicNowNs()) / 8e3;
  return std::max(min_pause_ms, 1 + 3 * produce_ms);
}

// The credit draws: the client holds its whole credit (nothing is pushed),
// frees its oldest batch and takes the next; publish -> holding from the
// later of the release and the slot's publish stamp, release -> holding, and
// the call's CPU.
void CreditDraws(loaderx::client::Loader& loader, size_t leases, int samples, double pause_ms,
                 Samples* p2h, Samples* round_trip, Samples* reply_cpu) {
  std::deque<loaderx::client::Batch> held;
  while (held.size() < leases) held.push_back(Take(loader, "next"));
  for (int i = 0; i < samples; ++i) {
    SleepMs(pause_ms);  // the next batch is gathered, not pushed: no credit
    const uint64_t c0 = ThreadCpuNs(), t0 = MonotonicNowNs();
    held.pop_front();  // its release returns one credit
    loaderx::client::Batch b = Take(loader, "next");
    loaderx::client::ArrayView v = b.Dense(0);
    const uint64_t t1 = MonotonicNowNs(), c1 = ThreadCpuNs();
    if (v.data == nullptr) Die("batch without values");
    p2h->push_back(Us(std::max(b.publish_ns(), t0), t1));
    round_trip->push_back(Us(t0, t1));
    reply_cpu->push_back(Us(c0, c1));
    held.push_back(std::move(b));
  }
}

int RunLoader(const Args& a) {
  auto client = Check(loaderx::Client::Connect(a.socket), "connect");
  loaderx::client::LoaderSpec spec;
  spec.stores = {a.store};
  spec.batch_size = a.batch;
  spec.mode = loaderx::SamplerMode::kIID;
  spec.seed = kSeed;
  spec.prefetch = 2;
  spec.leases = 4;
  spec.push_queue = !a.socket_push;
  // Views of the shared ring (no private mapping per batch): the hand-off
  // itself, as the figures in docs/benchmarks.md were measured.
  spec.shared_view = true;
  auto loader = Check(client->OpenLoader(spec), "open loader");
  VerifyAgainstEmbedded(*loader, a.store, a.batch);
  if (a.throughput > 0) return RunThroughput(a, *loader);

  uint64_t nbytes = 0;
  const double pause_ms = PauseMs(*loader, a.pause_ms, &nbytes);

  Samples p2h, round_trip, reply_cpu;
  CreditDraws(*loader, spec.leases, a.samples, pause_ms, &p2h, &round_trip, &reply_cpu);

  int skipped = 0;
  const int max_attempts = 10 * a.samples;
  // `before` waits; `on_skip` reacts to a draw whose batch was not ready;
  // `held` as TimedQueuedDraw's (null: the caller holds nothing).
  std::optional<loaderx::client::Batch> held;
  auto draw_until = [&](Samples* wall, Samples* cpu, std::optional<loaderx::client::Batch>* keep,
                        auto&& before, auto&& on_skip) {
    for (int attempts = 0; int(wall->size()) < a.samples; ++attempts) {
      if (attempts >= max_attempts) Die("batches were rarely ready: raise --pause-ms");
      before();
      if (!TimedQueuedDraw(*loader, keep, wall, cpu)) {
        ++skipped;
        on_skip();
      }
    }
    held.reset();
  };
  Samples queued, queued_cpu, bare, bare_cpu, warm, warm_cpu;
  draw_until(
      &queued, &queued_cpu, &held, [&] { SleepMs(pause_ms); }, [] {});
  draw_until(
      &bare, &bare_cpu, nullptr, [&] { SleepMs(pause_ms); }, [] {});
  // The pause makes the batch (as for the cold draws), then the client
  // computes for --warm-us: one warm-up at every size, so a size dependence
  // is the hand-off's and not a longer wait's.
  const double warm_us = a.warm_us;
  draw_until(
      &warm, &warm_cpu, &held,
      [&] {
        SleepMs(pause_ms);
        BusyWaitUs(warm_us);
      },
      [] {});
  loader->Close();

  std::printf("{\"nbytes\": %" PRIu64
              ", \"pause_ms\": %.3f, \"warm_us\": %.1f,"
              " \"skipped\": %d,\n",
              nbytes, pause_ms, warm_us, skipped);
  PrintSamples("publish_to_holding", p2h);
  PrintSamples("round_trip", round_trip);
  PrintSamples("reply_cpu", reply_cpu);
  PrintSamples("queued", queued);
  PrintSamples("queued_cpu", queued_cpu);
  PrintSamples("queued_bare", bare);
  PrintSamples("queued_bare_cpu", bare_cpu);
  PrintSamples("warm", warm);
  PrintSamples("warm_cpu", warm_cpu, true);
  std::printf("}\n");
  return 0;
}

// A frame about the size of a one-stream `batch` message.
constexpr size_t kFrameBytes = 200;

Samples CrossProcessWake(int samples, double pause_ms, bool receiver_sleeps) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) Die("socketpair");
  const pid_t pid = ::fork();
  if (pid < 0) Die("fork");
  if (pid == 0) {
    ::close(sv[0]);
    uint8_t frame[kFrameBytes] = {};
    for (int i = 0; i < samples; ++i) {
      if (!receiver_sleeps) SleepMs(pause_ms);  // the receiver is blocked meanwhile
      const uint64_t t = MonotonicNowNs();
      std::memcpy(frame, &t, sizeof(t));
      if (::send(sv[1], frame, sizeof(frame), 0) != ssize_t(sizeof(frame))) ::_exit(1);
      char ack;  // one message in flight at a time
      if (::recv(sv[1], &ack, 1, 0) != 1) ::_exit(1);
    }
    ::_exit(0);
  }
  ::close(sv[1]);
  Samples out;
  uint8_t frame[kFrameBytes];
  for (int i = 0; i < samples; ++i) {
    if (receiver_sleeps) SleepMs(pause_ms);  // the frame is queued meanwhile
    const uint64_t t0 = MonotonicNowNs();
    if (::recv(sv[0], frame, sizeof(frame), 0) != ssize_t(sizeof(frame))) Die("recv");
    const uint64_t t1 = MonotonicNowNs();
    uint64_t sent;
    std::memcpy(&sent, frame, sizeof(sent));
    out.push_back(receiver_sleeps ? Us(t0, t1) : Us(sent, t1));
    if (::send(sv[0], "a", 1, 0) != 1) Die("send ack");
  }
  ::close(sv[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return out;
}

// Warm per-stage costs of the client's NextUntil (same functions it calls):
// `timed` is timed, `untimed` runs after it each time.
template <typename F, typename G>
Samples Stage(int n, F&& timed, G&& untimed) {
  Samples out;
  for (int i = 0; i < n; ++i) {
    const uint64_t t0 = MonotonicNowNs();
    timed();
    out.push_back(Us(t0, MonotonicNowNs()));
    untimed();
  }
  return out;
}

int RunCalibrate(const Args& a) {
  Samples wake = CrossProcessWake(a.samples, a.pause_ms, /*receiver_sleeps=*/false);
  Samples cold_recv = CrossProcessWake(a.samples, a.pause_ms, /*receiver_sleeps=*/true);

  constexpr int kStageRuns = 20000;
  loaderx::BatchMsg bm;
  bm.step = 123456;
  bm.slot = 3;
  bm.seq = 987654;
  bm.offset = 1 << 20;
  bm.batch_size = 256;
  bm.total_bytes = 38535168;
  bm.streams.push_back({0, 0, 38535168, 0, 0});
  const std::vector<uint8_t> frame = loaderx::EncodeMessage(bm);
  const std::vector<uint8_t> release = loaderx::EncodeMessage(loaderx::ReleaseMsg{3, 987654});
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) Die("socketpair");
  Check(loaderx::SendFrame(sv[1], frame), "send");
  Samples recv = Stage(
      kStageRuns, [&] { (void)Check(loaderx::RecvFrame(sv[0]), "recv"); },
      [&] { Check(loaderx::SendFrame(sv[1], frame), "send"); });
  (void)Check(loaderx::RecvFrame(sv[0]), "recv");
  Samples send = Stage(
      kStageRuns, [&] { Check(loaderx::SendFrame(sv[1], release), "send"); },
      [&] { (void)Check(loaderx::RecvFrame(sv[0]), "recv"); });
  ::close(sv[0]);
  ::close(sv[1]);
  Samples decode = Stage(
      kStageRuns, [&] { (void)Check(loaderx::DecodeMessage(frame), "decode"); }, [] {});
  auto g = Check(loaderx::RingGeometry::Compute(8, 1 << 20), "geometry");
  // Ring memory as the daemon's memfd would be: zeroed, page aligned.
  std::vector<uint64_t> words(g.total_bytes / 8 + 1);
  uint8_t* ring = reinterpret_cast<uint8_t*>(words.data());
  loaderx::InitRing(ring, g, 1, 1);
  loaderx::PublishSlot(ring, g, 3, 987654, 123456, g.payload_offset, 4096);
  Samples check = Stage(
      kStageRuns,
      [&] {
        uint64_t stamp = 0;
        Check(loaderx::CheckSlot(ring, g, 3, 987654, 123456, g.payload_offset, 4096, &stamp),
              "check");
      },
      [] {});
  std::printf("{\n");
  PrintSamples("wake", wake);
  PrintSamples("queued_cold_recv", cold_recv);
  PrintSamples("stage_recv", recv);
  PrintSamples("stage_send", send);
  PrintSamples("stage_decode", decode);
  PrintSamples("stage_check_slot", check, true);
  std::printf("}\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--calibrate") {
      a.calibrate = true;
      continue;
    }
    if (k == "--socket-push") {
      a.socket_push = true;
      continue;
    }
    if (i + 1 >= argc) Die(k + ": missing value");
    const char* v = argv[++i];
    if (k == "--socket") {
      a.socket = v;
    } else if (k == "--store") {
      a.store = v;
    } else if (k == "--batch") {
      a.batch = std::strtoull(v, nullptr, 10);
    } else if (k == "--samples") {
      a.samples = std::atoi(v);
    } else if (k == "--pause-ms") {
      a.pause_ms = std::atof(v);
    } else if (k == "--warm-us") {
      a.warm_us = std::atof(v);
    } else if (k == "--throughput") {
      a.throughput = std::atoi(v);
    } else if (k == "--work-us") {
      a.work_us = std::atof(v);
    } else {
      Die("unknown option " + k);
    }
  }
  if (a.samples < 1) Die("--samples must be >= 1");
  if (a.calibrate) return RunCalibrate(a);
  if (a.socket.empty() || a.store.empty() || a.batch == 0) {
    Die("usage: --socket PATH --store DIR --batch N [--samples N] [--pause-ms F] [--warm-us N]"
        " [--throughput N [--work-us N]] | --calibrate");
  }
  return RunLoader(a);
}
