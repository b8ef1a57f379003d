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
  ExpectRoundTrip(ConsumedMsg{3, 18, true});
}

// Little-endian bytes of `v`, `n` wide: the frames below are spelled out
// byte by byte, as docs/protocol.md "Encoding" draws them.
void PutLe(std::vector<uint8_t>& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

std::vector<uint8_t> ConsumedFrame(uint64_t gen, uint64_t step, uint8_t waiting) {
  std::vector<uint8_t> f = {0xc1, 0x03};
  PutLe(f, gen, 8);
  PutLe(f, step, 8);
  f.push_back(waiting);
  return f;
}

std::vector<uint8_t> ReleaseFrame(uint64_t slot, uint64_t seq, int slot_bytes = 4) {
  std::vector<uint8_t> f = {0xc1, 0x02};
  PutLe(f, slot, slot_bytes);
  PutLe(f, seq, 8);
  return f;
}

// A batch frame with `count` in its count byte and the given stream records
// (kind byte, then four u64 each).
std::vector<uint8_t> BatchFrame(uint64_t slot, uint8_t count,
                                const std::vector<StreamLayoutMsg>& streams, int slot_bytes = 4) {
  std::vector<uint8_t> f = {0xc1, 0x01};
  PutLe(f, 2, 8);  // gen
  PutLe(f, 7, 8);  // step
  PutLe(f, slot, slot_bytes);
  PutLe(f, 44, 8);    // seq
  PutLe(f, 8192, 8);  // offset
  PutLe(f, 256, 8);   // batch_size
  PutLe(f, 4096, 8);  // total_bytes
  f.push_back(count);
  for (const StreamLayoutMsg& l : streams) {
    f.push_back(static_cast<uint8_t>(l.kind));
    PutLe(f, l.values_offset, 8);
    PutLe(f, l.values_bytes, 8);
    PutLe(f, l.shapes_offset, 8);
    PutLe(f, l.offsets_offset, 8);
  }
  return f;
}

void ExpectRefused(const std::vector<uint8_t>& frame, const std::string& message) {
  Status s = DecodeError(frame);
  EXPECT_EQ(s.code(), Status::Code::kProtocol) << s.ToString();
  EXPECT_EQ(s.message(), message);
}

TEST(WireTest, OnlyTheThreePerBatchMessagesAreBinaryFrames) {
  // 0xc1 is the byte msgpack never uses: every msgpack frame starts with a
  // map header (fixmap 0x80..0x8f, map16 0xde, map32 0xdf), a binary frame
  // with the mark.
  const std::vector<Message> all = {HelloMsg{},      HelloOkMsg{}, OpenMsg{},    OpenedMsg{},
                                    BatchMsg{},      SeekMsg{},    ReleaseMsg{}, StatsMsg{},
                                    StatsReplyMsg{}, CloseMsg{},   OkMsg{},      ErrorMsg{},
                                    HeartbeatMsg{},  ConsumedMsg{}};
  ASSERT_EQ(all.size(), std::variant_size_v<Message>);
  for (const Message& m : all) {
    const std::vector<uint8_t> f = EncodeMessage(m);
    const bool binary = std::holds_alternative<BatchMsg>(m) ||
                        std::holds_alternative<ReleaseMsg>(m) ||
                        std::holds_alternative<ConsumedMsg>(m);
    ASSERT_FALSE(f.empty());
    EXPECT_EQ(f[0] == kBinaryFrameMark, binary) << MessageName(m);
    if (!binary) EXPECT_EQ(f[0] & 0xf0, 0x80) << MessageName(m);
  }
}

TEST(WireTest, ConsumedFrameIsItsNineteenBytes) {
  // mark, type 3, gen u64, step u64, waiting u8.
  EXPECT_EQ(EncodeMessage(ConsumedMsg{3, 18}), ConsumedFrame(3, 18, 0));
  EXPECT_EQ(EncodeMessage(ConsumedMsg{3, 18, true}), ConsumedFrame(3, 18, 1));
  EXPECT_EQ(EncodeMessage(ConsumedMsg{3, 18}).size(), 19u);
  EXPECT_EQ(kConsumedFrameBytes, 19u);
  EXPECT_STREQ(MessageName(Message{ConsumedMsg{}}), "consumed");
  // Limits.
  ExpectRoundTrip(ConsumedMsg{0, 0, false});
  ExpectRoundTrip(ConsumedMsg{UINT64_MAX, UINT64_MAX, true});
  auto r = DecodeMessage(ConsumedFrame(0x0102030405060708ULL, 0xfffffffffffffffeULL, 1));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(std::get<ConsumedMsg>(*r) ==
              (ConsumedMsg{0x0102030405060708ULL, 0xfffffffffffffffeULL, true}));
}

TEST(WireTest, ConsumedWaitingIsZeroOrOne) {
  ExpectRefused(ConsumedFrame(3, 18, 2), "consumed: 'waiting' is 2 (0 or 1)");
  ExpectRefused(ConsumedFrame(3, 18, 0xff), "consumed: 'waiting' is 255 (0 or 1)");
}

TEST(WireTest, ReleaseFrameIsItsFourteenBytes) {
  // mark, type 2, slot u32, seq u64.
  EXPECT_EQ(EncodeMessage(ReleaseMsg{3, 44}), ReleaseFrame(3, 44));
  EXPECT_EQ(kReleaseFrameBytes, 14u);
  ExpectRoundTrip(ReleaseMsg{0, 0});
  ExpectRoundTrip(ReleaseMsg{UINT32_MAX, UINT64_MAX});
  auto r = DecodeMessage(ReleaseFrame(0xfffffffe, 0x1122334455667788ULL));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(std::get<ReleaseMsg>(*r) == (ReleaseMsg{0xfffffffe, 0x1122334455667788ULL}));
}

TEST(WireTest, BatchFrameIsItsHeaderAndOneRecordPerStream) {
  const std::vector<StreamLayoutMsg> streams = {{0, 0, 1024, 0, 0}, {1, 1024, 64, 1088, 2112}};
  const BatchMsg m{2, 7, 3, 44, 8192, 256, 4096, streams};
  EXPECT_EQ(EncodeMessage(m), BatchFrame(3, 2, streams));
  EXPECT_EQ(EncodeMessage(m).size(), 55u + 2 * 33u);
  EXPECT_EQ(BatchFrameBytes(2), 121u);
  EXPECT_EQ(EncodeMessage(BatchMsg{}).size(), 55u);  // no streams: the header alone
  // One stream: 88 bytes (the 1.2 msgpack map of a Fashion-MNIST batch was
  // about 100).
  EXPECT_EQ(EncodeMessage(BatchMsg{0, 1000, 3, 1001, 1 << 20, 256, 200704, {{0, 0, 200704, 0, 0}}})
                .size(),
            88u);
}

TEST(WireTest, BatchRoundTripsWithExactValuesAtTheLimits) {
  ExpectRoundTrip(BatchMsg{});
  const StreamLayoutMsg max{1, UINT64_MAX, UINT64_MAX, UINT64_MAX, UINT64_MAX};
  BatchMsg m{
      UINT64_MAX, UINT64_MAX, UINT32_MAX, UINT64_MAX,
      UINT64_MAX, UINT64_MAX, UINT64_MAX, std::vector<StreamLayoutMsg>(kMaxWireStreams, max)};
  m.streams[0] = {0, 0, 0, 0, 0};
  m.streams[63] = {0, 1, 2, 3, 4};
  ExpectRoundTrip(m);
  EXPECT_EQ(EncodeMessage(m).size(), 55u + 64 * 33u);
  // Decoded field by field from hand-written bytes (no encoder involved).
  const std::vector<StreamLayoutMsg> streams = {{1, 5, 6, 7, 8}};
  auto r = DecodeMessage(BatchFrame(UINT32_MAX, 1, streams));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(std::get<BatchMsg>(*r) == (BatchMsg{2, 7, UINT32_MAX, 44, 8192, 256, 4096, streams}));
}

TEST(WireTest, MalformedBinaryFramesAreRefusedNamingTheProblem) {
  const std::vector<StreamLayoutMsg> one = {{0, 0, 64, 0, 0}};
  // Just the mark; an unknown type byte.
  ExpectRefused({0xc1}, "binary frame of 1 byte: no type byte");
  ExpectRefused({0xc1, 0x00}, "unknown binary message type 0x00");
  ExpectRefused({0xc1, 0x04, 0, 0, 0}, "unknown binary message type 0x04");
  ExpectRefused({0xc1, 0xff}, "unknown binary message type 0xff");
  // Short and long, each type.
  std::vector<uint8_t> f = ReleaseFrame(1, 2);
  f.pop_back();
  ExpectRefused(f, "release: binary frame of 13 bytes, expected 14");
  f = ReleaseFrame(1, 2);
  f.push_back(0);
  ExpectRefused(f, "release: binary frame of 15 bytes, expected 14");
  ExpectRefused({0xc1, 0x02}, "release: binary frame of 2 bytes, expected 14");
  f = ConsumedFrame(1, 2, 0);
  f.pop_back();
  ExpectRefused(f, "consumed: binary frame of 18 bytes, expected 19");
  f = ConsumedFrame(1, 2, 0);
  f.push_back(0);
  ExpectRefused(f, "consumed: binary frame of 20 bytes, expected 19");
  f = BatchFrame(1, 1, one);
  f.pop_back();
  ExpectRefused(f, "batch: binary frame of 87 bytes, expected 88 for 1 streams");
  f = BatchFrame(1, 1, one);
  f.push_back(0);
  ExpectRefused(f, "batch: binary frame of 89 bytes, expected 88 for 1 streams");
  // The count says 2, one record follows; the count says 0, one follows.
  ExpectRefused(BatchFrame(1, 2, one),
                "batch: binary frame of 88 bytes, expected 121 for 2 streams");
  ExpectRefused(BatchFrame(1, 0, one),
                "batch: binary frame of 88 bytes, expected 55 for 0 streams");
  ExpectRefused({0xc1, 0x01, 0}, "batch: binary frame of 3 bytes, expected 55 or more");
  f = BatchFrame(1, 0, {});
  f.pop_back();  // no count byte
  ExpectRefused(f, "batch: binary frame of 54 bytes, expected 55 or more");
  // Too many streams, even when the frame is as long as they would need.
  ExpectRefused(BatchFrame(1, 65, std::vector<StreamLayoutMsg>(65, one[0])),
                "batch: 65 streams exceeds 64");
  ExpectRefused(BatchFrame(1, 255, {}), "batch: 255 streams exceeds 64");
  // Kind 2 (any stream).
  ExpectRefused(BatchFrame(1, 1, {{2, 0, 64, 0, 0}}),
                "batch: streams[0] kind 2 (0 dense or 1 ragged)");
  ExpectRefused(BatchFrame(1, 2, {{1, 0, 64, 0, 0}, {0xff, 0, 64, 0, 0}}),
                "batch: streams[1] kind 255 (0 dense or 1 ragged)");
}

// `slot` is a u32 on the wire, so a slot above 2^32 - 1 cannot be written in
// its field: a sender that widens it to 8 bytes makes the frame 4 bytes too
// long, and that is what the decoder refuses (in a batch every later field
// then reads 4 bytes early: the count byte is total_bytes' top byte, 0).
TEST(WireTest, SlotAboveU32IsRefused) {
  ExpectRefused(ReleaseFrame(uint64_t{1} << 32, 1, /*slot_bytes=*/8),
                "release: binary frame of 18 bytes, expected 14");
  ExpectRefused(BatchFrame(uint64_t{1} << 32, 1, {{0, 0, 64, 0, 0}}, /*slot_bytes=*/8),
                "batch: binary frame of 92 bytes, expected 55 for 0 streams");
}

// One encoding per message type: the 1.2 msgpack maps of the binary types
// are refused, naming the encoding they must use.
TEST(WireTest, MsgpackFormsOfTheBinaryMessagesAreRefused) {
  msgpack::sbuffer b;
  msgpack::packer<msgpack::sbuffer> p(b);
  p.pack_map(9);  // protocol 1.2's batch map, exactly as a 1.2 daemon sent it
  p.pack(std::string("t"));
  p.pack(std::string("batch"));
  for (const char* k : {"gen", "step", "slot", "seq", "offset", "batch_size", "total_bytes"}) {
    p.pack(std::string(k));
    p.pack(1);
  }
  p.pack(std::string("streams"));
  p.pack_array(1);
  p.pack_array(5);
  for (int i = 0; i < 5; ++i) p.pack(0);
  ExpectRefused(Pack(b),
                "message 'batch' must be a binary frame (protocol 1.3), not a msgpack map");
  ExpectRefused(MapOf(std::string("t"), std::string("release"), std::string("slot"), 1,
                      std::string("seq"), 2),
                "message 'release' must be a binary frame (protocol 1.3), not a msgpack map");
  ExpectRefused(MapOf(std::string("t"), std::string("consumed"), std::string("gen"), 3,
                      std::string("step"), 18, std::string("waiting"), true),
                "message 'consumed' must be a binary frame (protocol 1.3), not a msgpack map");
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
  Status s = DecodeError(
      MapOf(std::string("t"), std::string("ok"), std::string("id"), 1, std::string("step"), 1));
  EXPECT_NE(s.message().find("missing key 'gen'"), std::string::npos) << s.message();
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
  // major is a u32.
  Status s = DecodeError(MapOf(std::string("t"), std::string("hello"), std::string("major"),
                               uint64_t{1} << 33, std::string("minor"), 3,
                               std::string("client_version"), std::string("x")));
  EXPECT_EQ(s.code(), Status::Code::kProtocol);
  EXPECT_NE(s.message().find("'major' = 8589934592 exceeds 4294967295"), std::string::npos)
      << s.message();
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

// `frame` (a msgpack map) with the value of `key` replaced by `value`.
template <typename V>
std::vector<uint8_t> WithValue(const std::vector<uint8_t>& frame, const std::string& key,
                               const V& value) {
  msgpack::object_handle oh =
      msgpack::unpack(reinterpret_cast<const char*>(frame.data()), frame.size());
  const msgpack::object_map& m = oh.get().via.map;
  msgpack::sbuffer b;
  msgpack::packer<msgpack::sbuffer> p(b);
  p.pack_map(m.size);
  for (uint32_t i = 0; i < m.size; ++i) {
    p.pack(m.ptr[i].key);
    if (m.ptr[i].key.as<std::string>() == key) {
      p.pack(value);
    } else {
      p.pack(m.ptr[i].val);
    }
  }
  return Pack(b);
}

// Protocol 1.4: `push_queue` rides on open only as true, `queue_bytes` on
// opened only when > 0; anything else is refused naming the key.
TEST(WireTest, PushQueueKeysRoundTripAndTheirUnsentValuesAreRefused) {
  OpenMsg open;
  open.streams = {{"x", false, false, 1}};
  open.batch_size = 1;
  open.push_queue = true;
  ExpectRoundTrip(open);
  Status s = DecodeError(WithValue(EncodeMessage(open), "push_queue", false));
  EXPECT_EQ(s.code(), Status::Code::kProtocol);
  EXPECT_NE(s.message().find("'push_queue' is sent only as true"), std::string::npos)
      << s.message();
  EXPECT_EQ(DecodeError(WithValue(EncodeMessage(open), "push_queue", 1)).code(),
            Status::Code::kProtocol);  // a boolean, not a number
  open.push_queue = false;
  const std::vector<uint8_t> plain = EncodeMessage(open);
  EXPECT_EQ(EncodeMessage(DecodeMessage(plain).value()), plain);  // not sent when false

  OpenedMsg opened{9, 10, 2, 8192, 1, {{0, "<f4", {2}, 1, 10}}, std::nullopt};
  opened.queue_bytes = 4096 + 65536;
  ExpectRoundTrip(opened);
  s = DecodeError(WithValue(EncodeMessage(opened), "queue_bytes", 0));
  EXPECT_EQ(s.code(), Status::Code::kProtocol);
  EXPECT_NE(s.message().find("'queue_bytes' must be > 0"), std::string::npos) << s.message();
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

// Protocol 1.5: a shard group over part of the ranks, with replicas. The
// keys travel only with a shard group and only when not the default.
TEST(WireTest, RankRangeAndReplicaKeysRoundTripAndAreRefusedOutsideAShardGroup) {
  OpenMsg open;
  open.streams = {{"x", false, false, 1}};
  open.batch_size = 1;
  open.world_size = 8;
  open.rank = 5;
  open.group = "job-node1";
  open.ranks_first = 4;
  open.ranks_count = 4;
  open.replicas = 2;
  ExpectRoundTrip(open);
  open.ranks_count = 0;
  open.replicas = 1;
  const std::vector<uint8_t> plain = EncodeMessage(open);
  msgpack::object_handle oh =
      msgpack::unpack(reinterpret_cast<const char*>(plain.data()), plain.size());
  EXPECT_EQ(oh.get().via.map.size, 14u);  // a 1.4 shard open: no 1.5 key
  EXPECT_EQ(std::get<OpenMsg>(DecodeMessage(plain).value()).ranks_count, 0u);

  const std::string g = "group", m = "group_mode", f = "ranks_first", c = "ranks_count",
                    r = "replicas";
  auto refused = [&](const std::vector<uint8_t>& frame, const std::string& needle) {
    Status st = DecodeError(frame);
    EXPECT_EQ(st.code(), Status::Code::kProtocol);
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  const std::string shard = "shard", broadcast = "broadcast", a = "a";
  ASSERT_TRUE(DecodeMessage(OpenWith(g, a, m, shard, f, 0, c, 1, r, 3)).ok());
  refused(OpenWith(g, a, m, shard, f, 0, c, 0), "'ranks_count' must be at least 1");
  refused(OpenWith(g, a, m, shard, f, 0), "missing key 'ranks_count'");
  refused(OpenWith(g, a, m, shard, r, 0), "'replicas' must be at least 1");
  refused(OpenWith(g, a, m, shard, r, kMaxReplicas + 1), "replicas");
  refused(OpenWith(g, a, m, broadcast, r, 2), "are for shard groups");
  refused(OpenWith(r, 2), "need a 'group'");
  refused(OpenWith(c, 1, f, 0), "need a 'group'");
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
      EncodeMessage(HelloMsg{1, 3, "x"}),
      EncodeMessage(SeekMsg{1, 5}),
      EncodeMessage(BatchMsg{0, 1, 2, 3, 4096, 8, 64, {{0, 0, 64, 0, 0}}}),
      EncodeMessage(ReleaseMsg{2, 3}),
      EncodeMessage(ConsumedMsg{1, 2, true}),
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

// Protocol 1.6: a schedule's S * K counts with mix_datasets = K and the
// sampler's segments, three values each; absent, the 1.2 shape.
TEST(WireTest, MixtureScheduleOpenRoundTripsAndItsShapeIsChecked) {
  const StreamFilesMsg part{"/a", true, false, 2, StreamRole::kMixPart};
  const StreamFilesMsg source{"", false, false, 0, StreamRole::kMixSource};
  OpenMsg open;
  open.batch_size = 2;
  open.streams = {part, part, source};
  open.mix_counts = {30, 70, 0, 50};
  open.mix_datasets = 2;
  open.segments = {0, 0, 100, 9, 100, 50};
  ExpectRoundTrip(open);
  auto refused = [](OpenMsg m, const std::string& needle) {
    Status s = DecodeError(EncodeMessage(m));
    EXPECT_EQ(s.code(), Status::Code::kProtocol);
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  OpenMsg bad = open;
  bad.mix_datasets = 3;  // 4 counts are not segments of 3
  refused(bad, "'mix_datasets' must be > 0 and divide");
  bad = open;
  bad.segments = {0, 0, 100};  // one segment for two
  refused(bad, "'segments' needs 3 values per segment");
  bad = open;
  bad.streams = {part, part, part, part};  // runs of K = 2, two streams: fine
  ExpectRoundTrip(bad);
  bad.streams = {part, part, part};
  refused(bad, "exactly 2 consecutive parts");
  bad = open;
  bad.mix_datasets = 0;  // 4 counts without a schedule: K = 4 parts per stream
  bad.segments.clear();
  refused(bad, "exactly 4 consecutive parts");
}

}  // namespace
}  // namespace loaderx
