#include "loaderx/wire.h"

#include <gtest/gtest.h>

#include <msgpack.hpp>
#include <random>
#include <string>

namespace loaderx {
namespace {

std::vector<uint8_t> Pack(const msgpack::sbuffer& b) {
  return {reinterpret_cast<const uint8_t*>(b.data()),
          reinterpret_cast<const uint8_t*>(b.data()) + b.size()};
}

// A msgpack map built from (key, value) pairs, to craft bad frames.
template <typename... KV>
std::vector<uint8_t> MapOf(const KV&... kv) {
  msgpack::sbuffer b;
  msgpack::packer<msgpack::sbuffer> p(b);
  p.pack_map(sizeof...(KV) / 2);
  (p.pack(kv), ...);
  return Pack(b);
}

Status DecodeError(const std::vector<uint8_t>& frame) {
  auto r = DecodeMessage(frame);
  EXPECT_FALSE(r.ok());
  return r.ok() ? Status::OK() : r.status();
}

void ExpectRoundTrip(const Message& m) {
  auto r = DecodeMessage(EncodeMessage(m));
  ASSERT_TRUE(r.ok()) << MessageName(m) << ": " << r.status().ToString();
  EXPECT_EQ(r->index(), m.index());
  EXPECT_TRUE(*r == m) << MessageName(m);
}

TEST(WireTest, EveryMessageTypeRoundTrips) {
  ExpectRoundTrip(HelloMsg{1, 0, "0.1.0"});
  ExpectRoundTrip(HelloOkMsg{1, 0, "0.1.0", 0xdeadbeefcafeULL, 12});
  OpenMsg open;
  open.streams = {{"/data/x", false, false, 4}, {"/data/tok", true, true, 2}};
  open.batch_size = 256;
  open.mode = 2;
  open.seed = UINT64_MAX;
  open.rank = 1;
  open.world_size = 2;
  open.start_step = 99;
  open.prefetch = 3;
  open.leases = 5;
  open.ring_bytes = 1 << 20;
  open.id = 41;
  ExpectRoundTrip(open);
  EXPECT_EQ(open.TotalFds(), 6u + 6u);
  OpenedMsg opened{41,          1000, 9,
                   1 << 22,     5,    {{0, "<f4", {3, 224, 224}, 3, 1000}, {1, "<i4", {}, 1, 1000}},
                   std::nullopt};
  ExpectRoundTrip(opened);
  ExpectRoundTrip(
      BatchMsg{2, 7, 3, 44, 8192, 256, 4096, {{0, 0, 1024, 0, 0}, {1, 1024, 64, 1088, 2112}}});
  ExpectRoundTrip(SeekMsg{42, 123456789});
  ExpectRoundTrip(ReleaseMsg{3, 44});
  ExpectRoundTrip(StatsMsg{43});
  ExpectRoundTrip(StatsReplyMsg{43, {{"sessions", 2}, {"slots_held", 0}}, ""});
  ExpectRoundTrip(CloseMsg{});
  ExpectRoundTrip(OkMsg{42, 5, 3});
  ExpectRoundTrip(ErrorMsg{8, "lease cap reached", 17, std::nullopt, std::nullopt});
  ExpectRoundTrip(ErrorMsg{2, "out of range", 17, 42, std::nullopt});       // a reply
  ExpectRoundTrip(ErrorMsg{4, "corrupt record", 18, std::nullopt, 3});      // pushed
  ExpectRoundTrip(HelloOkMsg{1, 2, "0.2.0", 7, 12, kHeartbeatIntervalMs});  // 1.2
  ExpectRoundTrip(HeartbeatMsg{});
  ExpectRoundTrip(ConsumedMsg{3, 18});
}

TEST(WireTest, ConsumedFrameIsExactlyItsMap) {
  // What docs/protocol.md and the fuzz seeds spell out: a map of three keys
  // in this order, nothing else (fixmap 0x83, fixstr keys, positive ints).
  const std::vector<uint8_t> frame = EncodeMessage(ConsumedMsg{3, 18});
  EXPECT_EQ(frame, MapOf(std::string("t"), std::string("consumed"), std::string("gen"), 3,
                         std::string("step"), 18));
  EXPECT_EQ(frame.size(), 23u);
  EXPECT_EQ(frame[0], 0x83);
  EXPECT_STREQ(MessageName(Message{ConsumedMsg{}}), "consumed");
  // Both keys are required, unsigned, and no other key is allowed.
  Status s = DecodeError(MapOf(std::string("t"), std::string("consumed"), std::string("gen"), 1));
  EXPECT_NE(s.message().find("missing key 'step'"), std::string::npos) << s.message();
  s = DecodeError(MapOf(std::string("t"), std::string("consumed"), std::string("step"), 1));
  EXPECT_NE(s.message().find("missing key 'gen'"), std::string::npos) << s.message();
  s = DecodeError(MapOf(std::string("t"), std::string("consumed"), std::string("gen"), 1,
                        std::string("step"), -1));
  EXPECT_EQ(s.code(), Status::Code::kProtocol);
  s = DecodeError(MapOf(std::string("t"), std::string("consumed"), std::string("gen"), 1,
                        std::string("step"), 2, std::string("id"), 3));
  EXPECT_NE(s.message().find("unknown key 'id'"), std::string::npos) << s.message();
}

TEST(WireTest, ConsumedWaitingFlagIsAnOptionalBooleanSentOnlyWhenSet) {
  // consumed {gen 3, step 18, waiting true}: a fixmap of four, the flag last
  // (msgpack true is 0xc3); 32 bytes, spelled out for docs/protocol.md.
  const std::vector<uint8_t> waiting = EncodeMessage(ConsumedMsg{3, 18, true});
  const std::vector<uint8_t> want = {0x84, 0xa1, 't', 0xa8, 'c', 'o',  'n',  's', 'u', 'm', 'e',
                                     'd',  0xa3, 'g', 'e',  'n', 0x03, 0xa4, 's', 't', 'e', 'p',
                                     0x12, 0xa7, 'w', 'a',  'i', 't',  'i',  'n', 'g', 0xc3};
  EXPECT_EQ(waiting, want);
  ExpectRoundTrip(ConsumedMsg{3, 18, true});
  // Unset, the frame is the 23-byte frame without the key.
  EXPECT_EQ(EncodeMessage(ConsumedMsg{3, 18, false}).size(), 23u);
  // An explicit false is the same as no flag.
  auto r = DecodeMessage(MapOf(std::string("t"), std::string("consumed"), std::string("gen"), 3,
                               std::string("step"), 18, std::string("waiting"), false));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(std::get<ConsumedMsg>(*r) == (ConsumedMsg{3, 18, false}));
  // Anything but a boolean is refused, naming the key.
  for (const std::vector<uint8_t>& bad :
       {MapOf(std::string("t"), std::string("consumed"), std::string("gen"), 3, std::string("step"),
              18, std::string("waiting"), 1),
        MapOf(std::string("t"), std::string("consumed"), std::string("gen"), 3, std::string("step"),
              18, std::string("waiting"), std::string("true")),
        MapOf(std::string("t"), std::string("consumed"), std::string("gen"), 3, std::string("step"),
              18, std::string("waiting"), msgpack::type::nil_t())}) {
    Status s = DecodeError(bad);
    EXPECT_EQ(s.code(), Status::Code::kProtocol);
    EXPECT_NE(s.message().find("'waiting' must be a boolean"), std::string::npos) << s.message();
  }
}

TEST(WireTest, HelloOkWithoutHeartbeatIsTheOneA11ClientDecodes) {
  // heartbeat_ms 0 is not sent at all: the frame is the 1.1 frame.
  const std::vector<uint8_t> frame = EncodeMessage(HelloOkMsg{1, 2, "0.2.0", 7, 12, 0});
  const std::vector<uint8_t> with = EncodeMessage(HelloOkMsg{1, 2, "0.2.0", 7, 12, 250});
  EXPECT_LT(frame.size(), with.size());
  auto r = DecodeMessage(frame);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(std::get<HelloOkMsg>(*r).heartbeat_ms, 0u);
  EXPECT_STREQ(MessageName(Message(HeartbeatMsg{})), "heartbeat");
}

TEST(WireTest, ErrorMessageCarriesStatusCode) {
  ErrorMsg e = ErrorMsg::From(Status::ResourceExhausted("holding 8 batches"));
  Status s = e.ToStatus();
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(s.message(), "holding 8 batches");
}

TEST(WireTest, UnknownTypeIsRefused) {
  Status s = DecodeError(MapOf(std::string("t"), std::string("launch_missiles")));
  EXPECT_EQ(s.code(), Status::Code::kProtocol);
  EXPECT_NE(s.message().find("unknown message type"), std::string::npos) << s.message();
}

TEST(WireTest, UnknownKeyIsRefused) {
  Status s = DecodeError(MapOf(std::string("t"), std::string("seek"), std::string("id"), 1,
                               std::string("step"), 1, std::string("extra"), 2));
  EXPECT_EQ(s.code(), Status::Code::kProtocol);
  EXPECT_NE(s.message().find("unknown key 'extra'"), std::string::npos) << s.message();
}

TEST(WireTest, MissingKeyIsRefused) {
  Status s = DecodeError(MapOf(std::string("t"), std::string("release"), std::string("slot"), 1));
  EXPECT_NE(s.message().find("missing key 'seq'"), std::string::npos) << s.message();
}

TEST(WireTest, WrongValueTypesAreRefused) {
  EXPECT_EQ(DecodeError(
                MapOf(std::string("t"), std::string("seek"), std::string("step"), std::string("5")))
                .code(),
            Status::Code::kProtocol);
  EXPECT_EQ(
      DecodeError(MapOf(std::string("t"), std::string("seek"), std::string("step"), -1)).code(),
      Status::Code::kProtocol);
  EXPECT_EQ(
      DecodeError(MapOf(std::string("t"), std::string("seek"), std::string("step"), 1.5)).code(),
      Status::Code::kProtocol);
  EXPECT_EQ(DecodeError(MapOf(std::string("t"), 7)).code(), Status::Code::kProtocol);
}

TEST(WireTest, OutOfRangeFieldsAreRefused) {
  // slot is u32 on the wire.
  EXPECT_EQ(DecodeError(MapOf(std::string("t"), std::string("release"), std::string("slot"),
                              uint64_t{1} << 33, std::string("seq"), 1))
                .code(),
            Status::Code::kProtocol);
  // An error reply must not claim success.
  EXPECT_EQ(DecodeError(MapOf(std::string("t"), std::string("error"), std::string("code"), 0,
                              std::string("message"), std::string("x"), std::string("step"), 0))
                .code(),
            Status::Code::kProtocol);
}

TEST(WireTest, OpenWithoutStreamsOrWithZeroDataFilesIsRefused) {
  OpenMsg open;
  open.batch_size = 1;
  EXPECT_EQ(DecodeError(EncodeMessage(open)).code(), Status::Code::kProtocol);
  open.streams = {{"x", false, false, 0}};
  EXPECT_EQ(DecodeError(EncodeMessage(open)).code(), Status::Code::kProtocol);
}

// Protocol 1.1: group fields ride on open, the starting step on opened.
TEST(WireTest, GroupOpenAndOpenedStepRoundTrip) {
  OpenMsg open;
  open.streams = {{"/data/x", false, false, 1}};
  open.batch_size = 4;
  open.group = std::string(kMaxGroupName, 'g');
  open.group_mode = GroupMode::kBroadcast;
  open.join = GroupJoin::kStartStep;
  ExpectRoundTrip(open);
  open.group_mode = GroupMode::kShard;
  open.join = GroupJoin::kCurrent;
  ExpectRoundTrip(open);
  open.join = GroupJoin::kDefault;  // not sent; decodes as the default
  ExpectRoundTrip(open);
  OpenedMsg opened{9, 10, 2, 8192, 1, {{0, "<f4", {2}, 1, 10}}, std::nullopt};
  opened.step = 77;
  ExpectRoundTrip(opened);
}

// A solo open is byte-for-byte a 1.0 frame, so a 1.0 daemon accepts it.
TEST(WireTest, SoloOpenCarriesNoProtocol11Keys) {
  OpenMsg open;
  open.streams = {{"x", false, false, 1}};
  open.batch_size = 1;
  open.join = GroupJoin::kCurrent;  // meaningless without a group: dropped
  auto frame = EncodeMessage(open);
  msgpack::object_handle oh =
      msgpack::unpack(reinterpret_cast<const char*>(frame.data()), frame.size());
  ASSERT_EQ(oh.get().type, msgpack::type::MAP);
  EXPECT_EQ(oh.get().via.map.size, 12u);  // "t" + id + the ten 1.0 fields
  auto back = DecodeMessage(frame);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(std::get<OpenMsg>(*back).group.empty());
  EXPECT_EQ(std::get<OpenMsg>(*back).join, GroupJoin::kDefault);
  OpenedMsg opened{1, 10, 2, 8192, 1, {}, std::nullopt};
  auto o = EncodeMessage(opened);
  oh = msgpack::unpack(reinterpret_cast<const char*>(o.data()), o.size());
  EXPECT_EQ(oh.get().via.map.size, 7u);  // no "step" unless set
}

// Builds an open frame with the 1.0 fields plus `extra` (key, value) pairs.
template <typename... KV>
std::vector<uint8_t> OpenWith(const KV&... extra) {
  msgpack::sbuffer b;
  msgpack::packer<msgpack::sbuffer> p(b);
  p.pack_map(12 + sizeof...(KV) / 2);
  p.pack(std::string("t"));
  p.pack(std::string("open"));
  p.pack(std::string("id"));
  p.pack(1);
  p.pack(std::string("streams"));
  p.pack_array(1);
  p.pack_map(4);
  p.pack(std::string("label"));
  p.pack(std::string("x"));
  p.pack(std::string("has_shapes"));
  p.pack(false);
  p.pack(std::string("has_dict"));
  p.pack(false);
  p.pack(std::string("data_files"));
  p.pack(1);
  for (const char* k : {"batch_size", "mode", "seed", "rank", "world_size", "start_step",
                        "prefetch", "leases", "ring_bytes"}) {
    p.pack(std::string(k));
    p.pack(std::string(k) == "world_size" || std::string(k) == "batch_size" ? 1 : 0);
  }
  (p.pack(extra), ...);
  return Pack(b);
}

TEST(WireTest, MalformedGroupFieldsAreRefusedNamingTheKey) {
  const std::string g = "group", m = "group_mode", j = "join";
  ASSERT_TRUE(DecodeMessage(OpenWith(g, std::string("a"), m, std::string("shard"))).ok());
  auto refused = [&](const std::vector<uint8_t>& frame, const std::string& needle) {
    Status s = DecodeError(frame);
    EXPECT_EQ(s.code(), Status::Code::kProtocol);
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  refused(OpenWith(g, std::string(""), m, std::string("shard")), "'group' must be 1..256");
  refused(OpenWith(g, std::string(kMaxGroupName + 1, 'x'), m, std::string("shard")),
          "'group' must be 1..256");
  refused(OpenWith(g, std::string("a"), m, std::string("ring")), "'group_mode' must be");
  refused(OpenWith(g, std::string("a")), "missing key 'group_mode'");
  refused(OpenWith(g, std::string("a"), m, std::string("shard"), j, std::string("later")),
          "'join' must be");
  refused(OpenWith(g, 5, m, std::string("shard")), "'group' must be a string");
  refused(OpenWith(m, std::string("shard")), "need a 'group'");
  refused(OpenWith(j, std::string("current")), "need a 'group'");
}

TEST(WireTest, NonMapRootTrailingBytesAndDuplicateKeysAreRefused) {
  msgpack::sbuffer b;
  msgpack::pack(b, std::vector<int>{1, 2});
  EXPECT_EQ(DecodeError(Pack(b)).code(), Status::Code::kProtocol);

  auto frame = EncodeMessage(CloseMsg{});
  frame.push_back(0xc0);
  Status s = DecodeError(frame);
  EXPECT_NE(s.message().find("trailing"), std::string::npos) << s.message();

  EXPECT_EQ(DecodeError(MapOf(std::string("t"), std::string("seek"), std::string("step"), 1,
                              std::string("step"), 2))
                .code(),
            Status::Code::kProtocol);
  EXPECT_EQ(DecodeError({}).code(), Status::Code::kProtocol);
}

TEST(WireTest, ProtocolTwelveShapes) {
  // An error is a reply (id) or pushed (gen), never both.
  const std::vector<uint8_t> both = EncodeMessage(ErrorMsg{4, "x", 1, 7, 2});
  Status s = DecodeError(both);
  EXPECT_NE(s.message().find("not both"), std::string::npos) << s.message();
  // `next` is gone in 1.2: the daemon pushes.
  s = DecodeError(MapOf(std::string("t"), std::string("next")));
  EXPECT_NE(s.message().find("unknown message type 'next'"), std::string::npos) << s.message();
  // Requests need their id; batches their generation.
  s = DecodeError(MapOf(std::string("t"), std::string("seek"), std::string("step"), 1));
  EXPECT_NE(s.message().find("missing key 'id'"), std::string::npos) << s.message();
  s = DecodeError(MapOf(std::string("t"), std::string("stats")));
  EXPECT_NE(s.message().find("missing key 'id'"), std::string::npos) << s.message();
}

TEST(WireTest, HugeLengthClaimsAreRefusedWithoutAllocating) {
  // map32 claiming 2^32-1 entries, array32 claiming 2^32-1, str32 of 4 GiB.
  EXPECT_EQ(DecodeError({0xdf, 0xff, 0xff, 0xff, 0xff}).code(), Status::Code::kProtocol);
  EXPECT_EQ(DecodeError({0xdd, 0xff, 0xff, 0xff, 0xff}).code(), Status::Code::kProtocol);
  EXPECT_EQ(DecodeError({0x81, 0xa1, 't', 0xdb, 0xff, 0xff, 0xff, 0xff}).code(),
            Status::Code::kProtocol);
  // Deep nesting.
  std::vector<uint8_t> deep(100, 0x91);
  deep.push_back(0xc0);
  EXPECT_EQ(DecodeError(deep).code(), Status::Code::kProtocol);
}

TEST(WireTest, RandomAndMutatedFramesNeverCrash) {
  std::mt19937_64 rng(1234);
  std::vector<std::vector<uint8_t>> seeds = {
      EncodeMessage(HelloMsg{1, 2, "x"}), EncodeMessage(SeekMsg{1, 5}),
      EncodeMessage(BatchMsg{0, 1, 2, 3, 4096, 8, 64, {{0, 0, 64, 0, 0}}}),
      EncodeMessage(OpenedMsg{1, 10, 2, 8192, 1, {{0, "<f4", {2}, 1, 10}}, std::nullopt})};
  int decoded_ok = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> f;
    if (i % 2 == 0) {
      f.resize(rng() % 64);
      for (auto& c : f) c = static_cast<uint8_t>(rng());
    } else {
      f = seeds[rng() % seeds.size()];
      for (int k = 0, n = 1 + rng() % 4; k < n; ++k)
        f[rng() % f.size()] = static_cast<uint8_t>(rng());
    }
    auto r = DecodeMessage(f);
    if (r.ok()) {
      ++decoded_ok;
      // Whatever decodes must re-encode to something that decodes the same.
      auto again = DecodeMessage(EncodeMessage(*r));
      ASSERT_TRUE(again.ok());
      EXPECT_TRUE(*again == *r);
    } else {
      EXPECT_EQ(r.status().code(), Status::Code::kProtocol);
    }
  }
  EXPECT_LT(decoded_ok, 20000);
}

}  // namespace
}  // namespace loaderx

namespace loaderx {
namespace {

// Protocol 1.2 keys of issue 12: a group member's timeout, the status document.
TEST(WireTest, GroupTimeoutAndStatusDocumentRoundTrip) {
  OpenMsg open;
  open.streams = {{"x", false, false, 1}};
  open.batch_size = 4;
  open.group = "ddp";
  open.group_timeout_ms = 1500;
  ExpectRoundTrip(open);
  open.group_timeout_ms = 86'400'000;
  ExpectRoundTrip(open);
  ExpectRoundTrip(StatsMsg{44, true});
  StatsReplyMsg reply{44, {{"sessions", 1}}, std::string(kMaxStatusBytes, 'j')};
  ExpectRoundTrip(reply);
  ExpectRoundTrip(ErrorMsg{static_cast<uint32_t>(Status::Code::kTimeout), "group 'g': ...", 3,
                           std::nullopt, std::nullopt});
}

TEST(WireTest, GroupTimeoutNeedsAGroupAndAtMostADay) {
  OpenMsg solo;
  solo.streams = {{"x", false, false, 1}};
  solo.batch_size = 1;
  solo.group_timeout_ms = 5;  // meaningless without a group: not sent
  auto back = DecodeMessage(EncodeMessage(solo));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(std::get<OpenMsg>(*back).group_timeout_ms, 0u);
  OpenMsg grouped = solo;
  grouped.group = "g";
  grouped.group_timeout_ms = 86'400'001;
  Status st = DecodeError(EncodeMessage(grouped));
  EXPECT_EQ(st.code(), Status::Code::kProtocol);
  EXPECT_NE(st.message().find("group_timeout_ms"), std::string::npos) << st.message();
  StatsReplyMsg big{1, {}, std::string(kMaxStatusBytes + 1, 'j')};
  EXPECT_EQ(DecodeError(EncodeMessage(big)).code(), Status::Code::kProtocol);
  ErrorMsg unknown{15, "from the future", 0, std::nullopt, std::nullopt};
  EXPECT_EQ(DecodeError(EncodeMessage(unknown)).code(), Status::Code::kProtocol);
}

// Protocol 1.2: a mixture's streams are runs of K parts plus at most one
// dataset-number stream without files; a plain stream keeps the 1.0 shape.
TEST(WireTest, MixtureOpenRoundTripsAndItsShapeIsChecked) {
  const StreamFilesMsg plain{"/p", false, false, 1};
  const StreamFilesMsg part{"/a", true, false, 2, StreamRole::kMixPart};
  const StreamFilesMsg source{"", false, false, 0, StreamRole::kMixSource};
  OpenMsg open;
  open.batch_size = 2;
  open.streams = {part, part, plain, source, part, part};
  open.mix_counts = {30, 70};
  ExpectRoundTrip(open);
  EXPECT_EQ(open.TotalFds(), 4u * 5u + 3u);  // four parts of 5 fds, a plain store of 3
  auto refused = [](OpenMsg m, const std::string& needle) {
    Status s = DecodeError(EncodeMessage(m));
    EXPECT_EQ(s.code(), Status::Code::kProtocol);
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  OpenMsg bad = open;
  bad.streams = {part, part, part};  // a run of 3 for K = 2
  refused(bad, "exactly 2 consecutive parts");
  bad.streams = {part, plain, part};  // a run split by a plain stream
  refused(bad, "exactly 2 consecutive parts");
  bad.streams = {part, part, source, source};
  refused(bad, "at most one mix source");
  bad.streams = {plain};
  refused(bad, "without mix streams");
  bad = open;
  bad.mix_counts.clear();
  refused(bad, "need 'mix_counts'");
  bad = open;
  bad.streams[3].data_files = 1;
  refused(bad, "has no files");
  // The counts' values are the daemon's to check (mix.h), not the decoder's.
  bad = open;
  bad.mix_counts = {0, 5};
  EXPECT_TRUE(DecodeMessage(EncodeMessage(bad)).ok());
}

}  // namespace
}  // namespace loaderx
