// Group: one Pipeline and one ring shared by the loaders ("members") that
// joined it (docs/daemon.md "Groups", docs/protocol.md "Groups (1.1)").
//
// Every open loader is a member of exactly one Group. A solo loader (no
// group name) is the only member of a private broadcast group, so there is
// one delivery path, not two. Named groups are keyed by (uid, name) in the
// server and shared by every member that passes the same spec.
//
// Modes:
//  * kBroadcast: the pipeline runs the members' sampler spec as is; every
//    member receives the same full batches (one gather, N mappings).
//  * kShard: the group serves the data-parallel ranks [F, F + C) of
//    world_size W (all of them, F = 0 and C = W, unless the members named a
//    range: the local ranks of one node of a multi-node job), each to R
//    members ("replicas": the model-parallel ranks of one data-parallel
//    replica; R = 1 unless named). The pipeline draws only those ranks'
//    rows: the sampler spec with batch C * B, world W / C and rank F / C,
//    which sampler.h guarantees is rows [F * B, (F + C) * B) of the global
//    batch (hence C must divide W and F). The member of rank r receives
//    rows [(r - F) * B, (r - F + 1) * B) of it, the batch a rank-r sampler
//    of W draws; its R replicas receive the same rows of the same slot.
//    Positions are kept per expected member, a *position* p = (r - F) * R +
//    k for replica k, so every rule below that speaks of "ranks" speaks of
//    positions (C * R of them, joined or not).
//
// Positions (protocol 1.2 pushes; Aeron's status messages are the model):
// every member has a push cursor (the next step pushed to its client) and a
// consumed position (the next step its caller takes, reported by the
// client's `consumed` frames of the member's current generation; a seek
// starts a new generation). consumed <= pushed <= consumed + W, with the
// push window W = min(leases, kPushAhead) (one batch).
// Everything user-visible keys on consumed positions exactly as protocol 1.1
// keyed on the request cursor: retention, OldestAvailable (IndexError of
// seeks and start_step joins), join="current", stats cursors and `served`,
// stall logging and the group timeout. cursor() is the consumed position.
//
// Retention: batches fetched from the pipeline are "held" by the group
// (published once, retained in the ring) until every consumed position
// that still needs them has passed: in kShard those of ALL ranks 0..W-1 (a
// rank not joined yet sits at the group's start step, a rank whose member
// left keeps its position frozen), in kBroadcast those of the current
// members. Pushed-unread batches are therefore held by the group AND leased
// by their client. A member's own leases keep a slot alive after the group
// drops it.
//
// Push rule: step s is pushed to member m only if s < consumed(m) + W (the
// window; the server also keeps m's client under its credit) and s <=
// S'(m) + max_skew, with S'(m) the slowest consumed position of the OTHER members
// (kShard: the other ranks, frozen and never-joined ones included). A solo
// member (or the only one left) is never gated by itself. A member further
// ahead waits (no error); the group advances at the pace of its slowest.
//
// Held steps. Let S be the slowest consumed position (it never decreases
// while the group has two members: seeks and joins land at or after the
// oldest held step, which is >= S; a sole member's seek drops everything).
// The held steps are contiguous, [S, produced). Each was pushed to some m
// under the rule when the slowest position was S0 <= S: if m was not the
// only slowest then S'(m) = S0 and s <= S + max_skew; if it was, consumed(m)
// = S0 and s < S + W. So held steps lie in [S, S + max(max_skew + 1, W)):
// at most H = max(max_skew + 1, W) = max_skew + 1 (W is 1). A solo
// member's held steps are all pushed-unread, hence all leased.
//
// Ring sizing (Slots()): prefetch + leases + max_skew + 1 slots, each sized
// for one (global) batch. Claim: the slowest member (consumed position S)
// can always make progress. If its push cursor is past S, the batch of S is
// in its client's queue. Otherwise it pushes step S (the rule allows it:
// S <= S'(m)), once its client is under its credit (the client's business,
// as in 1.1). Live slots are (a) batches inside the pipeline, ready or in
// production: at most `prefetch` (the Pipeline's bound); (b) batches held by
// the group, steps in [S, produced), at most H; (c) batches the group dropped
// that a client still leases: steps < S. If step S is held the member takes
// it without any allocation. Otherwise nothing is held ((b) is contiguous
// from S, so S missing means none) and the pipeline must allocate step S:
// with (c) <= leases there are at most prefetch - 1 + leases slots live
// besides it, so a slot is free. (c) <= leases holds whenever every member
// holds only batches of its own last `leases` consumed steps (a training loop
// does): a member at consumed position c' >= S then leases steps in
// [c' - leases, c' + W), so all leased steps below S lie in [S - leases,
// S). With the window of one, H = max_skew + 1 for every configuration, so
// the ring needs no slot beyond it (the slots for `leases` cover what the
// callers hold, not pushes ahead). A member hoarding older batches can
// exhaust the ring; then the ring refuses the step with ResourceExhausted
// (as for a solo client)
// only once every live slot is leased by clients and none is held by the
// group: the allocator counts held slots as "room may still come", so a
// group never fails a step merely because members are spread out.
//
// Payload bytes: with dense streams only, every batch has one size M, so
// holes are whole batches and slots * M bytes fit any slots live batches.
// With a ragged stream sizes vary (M is then an estimate: records up to
// twice the mean) and first fit can leave a hole beside every live region
// that is just short of the next batch; (2 * slots - 1) * M bytes guarantee
// that a batch of at most M fits beside slots - 1 live ones. Without it a
// client holding fewer batches than its leases was refused a step
// (ResourceExhausted) by a ring that had room, only in pieces; found by the
// soak test (tests/integration/test_reliability.py).
//
// Live bound (broadcast groups with Options::max_live = K > 0, loaderxd
// --group-live-batches): the pipeline starts a step -- allocates its ring
// slot -- only while fewer than K of the ring's slots are live (in the
// pipeline, held by the group for members, or leased by members' clients,
// counted by the ring itself), or, for steps up to S, while the gate is
// open: a member at the slowest consumed position S has nothing pushed
// unread, its caller is blocked in next() for it (its client said so) and S
// is not gathered yet. A producer that waited across a pipeline seek passes
// (its step is stale, and with prefetch 1 it would hold back the sought one). So with members that
// hold only their last batch the ring never has more than K batches live, and K, not the skew
// window, bounds its resident pages (docs/daemon.md "Memory"). The open gate keeps the progress
// claim of "Ring sizing": the slowest member can always get step S, whatever its client holds (then
// up to the ring's slots are live, as without the bound). A member ahead of S whose step waits at
// the gate waits for peers exactly as at the skew limit (the group timeout, stall logs and status
// `waiting` apply, naming the slowest members): K therefore also bounds how far members spread.
// A slot freed in the ring (a client's release included) wakes a gated producer at once.
//
// Group timeout (protocol 1.1's meaning): a member "waits for peers" only
// while its caller is blocked in next() with nothing queued -- its client
// said so (`consumed` with waiting: true; the flag holds until an item is
// pushed to the member, a `consumed` without it, or an accepted seek) --
// and its next push is blocked by the skew rule (in kShard a rank that
// never joined, left, or is stuck holds every other rank back once they
// are max_skew ahead). A caller pausing between next() calls (an eval) or
// still holding batches queued never waits, however far behind its peers
// are. If the wait lasts longer than its timeout, its push is a Timeout
// status naming the ranks (members) it waits for and the step; its
// positions do not move, and the wait starts again only when the caller
// waits again (the client says so anew). The wait
// for the pipeline itself (a slow gather) is not a wait for a peer and has
// no timeout. Stalls are logged (info) once per change of state: when
// the group has waited kStallLogAfter (at most half the waiter's timeout)
// for the same ranks at the same step, and once more when it goes on.
//
// Start and resume (shard). A member joining with join = start_step at a
// step the group no longer holds (a rank opened with its constructor's
// start_step, then sought to its checkpoint by load_state_dict, after a
// peer that was alone moved the group there) is accepted "not started": its
// rank's consumed position is that step, below every held step, so the
// group trims nothing and its peers wait at the skew limit for it. It may
// seek to any held (or future) step, as any member of a group of several.
// Its position itself can never be pushed: the push waits until its caller
// waits in next() (so a seek issued before the first next() always comes
// first) and is then the IndexError naming its step and the oldest step the
// group holds; a later next() gets it again. A member can therefore only
// ever receive its own step, never a shifted one. If it leaves without
// moving, its rank gets back the position it had before the join (raised
// to the oldest held step). A sole member's seek moves the pipeline and
// every rank without a live member (the group's start), as before.
//
// Dead peers (shard). A rank whose last member left keeps its position
// (frozen). While the process of that member still runs (a loader closed,
// maybe to reopen) the others wait for a new member of the rank up to their
// group timeout. Once that process is gone (killed, crashed, exited:
// PeerFate), a member that waits for peers (as for the timeout: its caller
// blocked in next(), the push skew-blocked) by that rank fails at once with
// the Timeout status naming the rank, the step it left at and how it left;
// its positions do not move. It is told once per member that left: a later
// next() waits for a new member of that rank (a restarted rank rejoining at
// its position or a later held step) up to its group timeout, as for a rank
// that never joined.
//
// Structure: the step rules above (held steps, cursors per member or
// position, retention, the push and skew rules, what is gathered next, join,
// leave and seek) are decided by a GroupPositions (group_positions.h), which
// has no threads or locks; Group holds it under its mutex and adds the
// pipeline (fetched through the BatchSource seam), the ring and the held
// batches' memory, the live gate, the timeouts and the stall logs.
//
// Thread-safety: all methods are thread-safe (one mutex; the pipeline is
// waited on without it by one member at a time, the "fetcher").
// Ownership: the group owns its Pipeline and ring; delivered batches share
// ownership of their ring memory and may outlive the group.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "group_positions.h"
#include "loaderx/loader.h"
#include "loaderx/sampler.h"
#include "loaderx/status.h"
#include "loaderx/store.h"
#include "loaderx/wire.h"
#include "ring_allocator.h"

namespace loaderx::daemon {

class LiveGate;  // serving_group.cc: the allocator of a group with a live bound

// One batch as handed to one member: its slice of a held batch.
struct Delivery {
  uint64_t gen = 0;  // the member's generation the batch was pushed in
  uint64_t step = 0;
  // A gather error of `step` (the member still advanced past it); the
  // fields below are then unset.
  Status error;
  uint32_t slot = 0;
  uint64_t seq = 0;
  uint64_t offset = 0;                // of the whole batch, from the ring start
  uint64_t total_bytes = 0;           // of the whole batch (what the slot table says)
  uint64_t batch_size = 0;            // rows of this member's slice
  std::vector<StreamLayout> streams;  // this member's slice, relative to offset
  std::shared_ptr<BatchMemory> memory;
};

class Group {
 public:
  // What a member asks for; a group refuses members whose identity differs.
  struct MemberSpec {
    std::vector<std::shared_ptr<const Store>> streams;
    SamplerSpec sampler;  // the member's own (rank, world_size) spec
    GroupMode mode = GroupMode::kBroadcast;
    // The mixture's counts (loaderx/mix.h) if the streams are mixed, else
    // empty: compared on their own, so a mismatch names the weights, not
    // the (equal) part files.
    std::vector<uint64_t> mix_counts;
    // kShard: the ranks served, [ranks_first, ranks_first + ranks_count)
    // (ranks_count 0: all of world_size), and members per rank.
    uint64_t ranks_first = 0;
    uint64_t ranks_count = 0;
    uint32_t replicas = 1;
    // The ranks served (ranks_count, or world_size when it is 0).
    uint64_t RankCount() const { return ranks_count != 0 ? ranks_count : sampler.world_size; }
    // InvalidArgument naming what does not fit: a range that is not an
    // aligned part of the world (C divides W and F), a rank outside it.
    Status Validate() const;
  };
  struct Options {
    uint32_t prefetch = 4;
    uint32_t leases = 8;  // the lease cap the ring is sized for
    uint32_t max_skew = 0;
    uint32_t threads = 0;
    int gather_nice = 0;      // PipelineOptions::gather_nice (loaderxd --gather-nice)
    uint64_t ring_bytes = 0;  // 0: sized from the streams
    uint64_t incarnation = 0;
    uint64_t session = 0;  // creator's session id (names the memfd)
    uint64_t start_step = 0;
    // The live bound K ("Live bound" above; 0: none). Broadcast only.
    uint32_t max_live = 0;
    // Incremented once per batch gathered (the server's stats), if set.
    std::atomic<uint64_t>* gathered = nullptr;
  };
  // Who a member is (for messages, logs and stats) and how long its `next`
  // may wait for the others (zero: forever, a solo loader's only member).
  struct MemberInfo {
    uint64_t rank = 0;
    int32_t pid = 0;
    uint32_t uid = 0;
    std::chrono::milliseconds timeout{0};
  };
  // A consistent picture of the group for stats (status.h).
  struct Snapshot {
    struct MemberRow {
      uint64_t session = 0;
      MemberInfo info;
      uint64_t position = 0;  // shard: its position (rank_cursors' index)
      uint64_t cursor = 0;
      uint64_t served = 0;  // batches handed to this member
    };
    std::string name;
    GroupMode mode = GroupMode::kBroadcast;
    uint64_t batch_size = 0;  // per member
    uint64_t world_size = 1;
    std::vector<MemberRow> members;  // by session id
    // Shard: the cursor of every position (rank ranks_first + p / replicas,
    // replica p % replicas; a position without a member is frozen where it
    // left, or at the start step if it never joined).
    std::vector<uint64_t> rank_cursors;
    uint64_t ranks_first = 0;
    uint64_t ranks_count = 0;  // shard: the ranks served (world_size if all)
    uint32_t replicas = 1;
    bool holds = false;  // any batch held; then oldest/newest are valid
    uint64_t oldest_held = 0;
    uint64_t newest_held = 0;
    uint64_t produced = 0;  // the step the pipeline delivers next
    // Set while a member waits for others: the ranks (shard) or sessions
    // (broadcast) at the slowest cursor, that step, and for how long (ms).
    bool waiting = false;
    std::vector<uint64_t> waits_for;
    uint64_t waits_at_step = 0;
    uint64_t waiting_ms = 0;
    uint64_t ring_bytes = 0;
    uint32_t slots = 0;
    uint32_t live_slots = 0;  // slots live now: in the pipeline, held or leased
    uint32_t max_live = 0;    // the live bound K (0: none)
    uint64_t gathered = 0;
    uint64_t served = 0;
  };
  // Batches pushed to a member ahead of what its caller took (at most its
  // credit). One in the client's socket removes the round trip; the rest of
  // the loader's `prefetch` waits, ready, in the pipeline, so a loader
  // through loaderxd keeps the ring memory of an embedded one plus one batch
  // (each pushed batch is a live slot its client leases).
  static constexpr uint32_t kPushAhead = 1;
  // How long a wait for peers lasts before the stall is logged.
  static constexpr std::chrono::seconds kStallLogAfter{30};

  // Slots of a group ring (see the header comment for why).
  static uint32_t Slots(const Options& o) { return o.prefetch + o.leases + o.max_skew + 1; }
  // The sampler spec the group's pipeline runs for members of `spec`.
  static SamplerSpec PipelineSpec(const MemberSpec& spec);
  // The ring geometry a group for `spec` would get (for accounting first).
  static Result<RingGeometry> Geometry(const MemberSpec& spec, const Options& options);

  // Creates ring and pipeline (at options.start_step). The creator still
  // has to Join(). `name` is for messages ("" for a solo loader's group).
  // The ring owns `charge` (its memory's, accounts.h) from now on.
  static Result<std::shared_ptr<Group>> Create(std::string name, MemberSpec spec,
                                               const Options& options,
                                               RingCharge charge = RingCharge());
  ~Group();  // implies Close()
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  // InvalidArgument naming the first field in which `spec` differs from the
  // group's, with both values.
  Status CheckCompatible(const MemberSpec& spec) const;

  // Adds member `id` (rank from its spec) and returns its first step.
  // InvalidArgument if every position of its rank is taken by a live
  // member (shard: `replicas` per rank), or if a live replica of its rank
  // that has not moved since it started started at another step (the
  // model-parallel ranks of one replica must start together; a member that
  // joins "not started" is held to it when it seeks).
  // join = start_step at a step the group has already dropped: broadcast
  // refuses it (IndexError, "out of range", naming the oldest step it still
  // holds); shard accepts it "not started" ("Start and resume" above): the
  // member may still seek to a held step, and its first push is that
  // IndexError if it does not.
  Result<uint64_t> Join(uint64_t id, const MemberInfo& info, GroupJoin join, uint64_t start_step);
  // Removes member `id`; true if no member is left (the caller then drops
  // the group). Its cursor is forgotten (broadcast) or frozen (shard; a
  // member that never got its step gives its position back what it had
  // before the join). `how` says how it left, for the messages of the
  // members that wait for its position ("Dead peers" above).
  bool Leave(uint64_t id, const std::string& how = "");
  // Shard: waits at most `max` for `rank` to have a position with no live
  // member; true if it has one (or the group is not a shard group, or the
  // rank is out of range: Join decides). A loader closed and reopened at once as the same
  // rank sends its close (or hangs up) on one connection and its open on
  // another, so the open may be read first: it waits for the old member's
  // leave instead of being refused. Call without the registry lock (a leave
  // takes it).
  bool AwaitRankFree(uint64_t rank, std::chrono::milliseconds max);

  // The batch at member `id`'s push cursor (to be pushed); advances the push
  // cursor. Waits (polling `closing` every `poll`) while the push rule (see
  // the header comment) forbids it or the batch is not gathered yet.
  // Cancelled when `closing` or the group closed.
  Result<Delivery> Next(uint64_t id, const std::function<bool()>& closing,
                        std::chrono::milliseconds poll);
  // What a `consumed {gen, step}` did.
  struct ConsumedResult {
    bool current = false;  // of the member's generation (else ignored)
    uint64_t steps = 0;    // how far the consumed position moved
    uint64_t batches = 0;  // of those steps, the ones that were batches (not errors)
  };
  // Member `id`'s caller takes `step` next; `waiting`: it is blocked in
  // next() for it (see "Group timeout"). Ignored (current = false) for an
  // older generation or a member that left; Protocol error (the client
  // broke the protocol) for a newer generation or a step below the consumed
  // position or beyond the push cursor.
  Result<ConsumedResult> Consumed(uint64_t id, uint64_t gen, uint64_t step, bool waiting = false);
  // The only member seeks the pipeline (exact resume); otherwise only the
  // member's positions move, by Join's start_step rule. Accepted, it starts
  // a new generation (generation()).
  Status Seek(uint64_t id, uint64_t step, const std::function<bool()>& closing,
              std::chrono::milliseconds poll);

  // Closes the pipeline and drops held batches. Idempotent.
  void Close();
  // Wakes every wait in Next/Seek now, so that their `closing` is polled
  // at once (a request or the session's end), not at the next `poll`.
  void Wake();

  const std::string& name() const { return name_; }
  GroupMode mode() const { return spec_.mode; }
  const std::shared_ptr<RingAllocator>& ring() const { return ring_; }
  uint32_t lease_cap() const { return options_.leases; }
  uint32_t slot_count() const { return ring_->geometry().slot_count; }
  // Batches fetched from the pipeline since creation (one gather each).
  uint64_t batches_gathered() const;
  size_t members() const;
  // Member `id`'s consumed position: the step its caller takes next.
  uint64_t cursor(uint64_t id) const;
  // Member `id`'s push cursor: the step pushed to it next.
  uint64_t pushed(uint64_t id) const;
  // Member `id`'s generation (0 at join; +1 per accepted seek).
  uint64_t generation(uint64_t id) const;
  Snapshot snapshot() const;

 private:
  struct Held {
    Status error;  // gather error of this step (no memory then)
    std::shared_ptr<BatchMemory> memory;
    BatchLayout layout;
    uint32_t slot = 0;
    uint64_t seq = 0;
  };
  // What Group keeps of a member besides its positions (GroupPositions).
  struct Member {
    MemberInfo info;
    // Shard: position -> that position's leave count this member was told
    // of as gone ("Dead peers": once per leave).
    std::map<uint64_t, uint64_t> told_gone;
    uint64_t gen = 0;
    uint64_t served = 0;  // steps consumed
    // Its caller is blocked in next() (the client's `consumed` with
    // waiting: true), until an item is pushed to it.
    bool caller_waits = false;
    // Set while this member waits for the others: caller_waits, nothing
    // pushed unread, and the push skew-blocked (the timeout clock runs).
    bool waiting = false;
    std::chrono::steady_clock::time_point waiting_since;
  };

  Group(std::string name, MemberSpec spec, const Options& options,
        std::shared_ptr<RingAllocator> ring, std::shared_ptr<LiveGate> gate,
        std::unique_ptr<Pipeline> pipeline);

  // All REQUIRE mu_ held.
  // Drops the batches of the steps positions_ no longer holds (after any
  // call that may trim it).
  void SyncHeld();
  // Opens the live bound's gate iff a member at the slowest position waits
  // for it ("Live bound"). Call after anything that moves positions or the
  // callers' waiting flags.
  void UpdateGate();
  // Whether member `me`'s push of `pushed` waits for peers at the live
  // bound: its step is not gathered, it is ahead of the slowest, and the
  // pipeline's producer for it waits at the gate.
  bool GateHolds(uint64_t pushed) const;
  // A member's wait for peers (skew or live bound; "Group timeout" and
  // "Dead peers"): runs
  // its clock, logs a stall, and returns the Timeout status once its
  // timeout is over; otherwise sets *wait to how long to wait at most.
  std::optional<Status> PeerWait(uint64_t id, Member& me, uint64_t pushed, bool live_bound,
                                 std::chrono::milliseconds poll, std::chrono::milliseconds* wait);
  // The Timeout status of member `id` whose push of `pushed` waited its
  // group timeout (`live_bound`: at the live bound, else at the skew limit).
  Status PeerTimeout(uint64_t id, const Member& me, uint64_t pushed, bool live_bound) const;
  // Shard: the Timeout status for the first position holding member `me`'s
  // push of `pushed` back whose last member's process is gone and that `me`
  // was not told of yet ("Dead peers"), if any.
  std::optional<Status> DeadPeerHoldingBack(uint64_t id, Member& me, uint64_t pushed);
  void DropHeld(std::map<uint64_t, Held>::iterator it);
  Delivery Slice(const Held& h, uint64_t step, uint64_t rank) const;
  // One pass of Next for member `id`: the push's result, or std::nullopt
  // after waiting (on cv_, or for the pipeline) for something to change.
  std::optional<Result<Delivery>> TryPush(uint64_t id, std::unique_lock<std::mutex>& lock,
                                          std::chrono::milliseconds poll);
  // Member `id`'s held step at its push cursor, sliced for it; advances the cursor.
  Delivery Deliver(uint64_t id, Member& me);
  // Fetches the next step for the whole group (this member is the fetcher):
  // seeks the pipeline to FetchTarget() if production lags, then waits at
  // most `wait` for the step. std::nullopt once held (or not ready yet).
  std::optional<Status> Fetch(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds wait);
  // Holds what the pipeline delivered for step positions_.produced().
  std::optional<Status> HoldFetched(Result<std::optional<BatchView>> got);
  // Seeks the pipeline through the seam (batch_source.h) and lets the live
  // gate's waiting producers pass. Call without mu_ held.
  Status SeekPipeline(uint64_t step);
  // The layout of the batch the pipeline delivered as `v` in `memory`.
  BatchLayout LayoutOf(const BatchView& v, BatchMemory& memory) const;
  // The Timeout status of member `id`, whose push of `pushed` waits for
  // `position`, whose last member's process is gone (`fate`; "Dead peers").
  Status DeadPeer(uint64_t id, uint64_t pushed, uint64_t position, const std::string& fate) const;
  // Logs a stall of the group once per state; Resumed() once it ends.
  void NoteStall(std::chrono::steady_clock::duration waited, std::chrono::milliseconds timeout);
  void NoteProgress();

  const std::string name_;
  const MemberSpec spec_;
  const Options options_;
  const std::shared_ptr<RingAllocator> ring_;
  const std::shared_ptr<LiveGate> gate_;  // null without a live bound
  const std::unique_ptr<Pipeline> pipeline_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // a batch was held, a cursor moved, a fetch ended
  // Guarded by mu_.
  GroupPositions positions_;       // every step decision (group_positions.h)
  std::map<uint64_t, Held> held_;  // the batches of positions_.held()
  bool fetching_ = false;          // a member waits on the pipeline (unlocked)
  bool closed_ = false;
  uint64_t gathered_ = 0;
  std::map<uint64_t, Member> members_;  // session id -> member
  uint64_t served_ = 0;
  // The stall last logged ("" = none): waits_for + step, and since when.
  std::string stall_logged_;
  uint64_t stall_step_ = 0;
  std::chrono::steady_clock::time_point stall_since_;
};

}  // namespace loaderx::daemon
