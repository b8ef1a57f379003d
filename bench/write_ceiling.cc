// loaderx_write_ceiling: what this machine can do at best for a store write,
// with no loaderx code on the path (bench/bench_store.py runs it beside every
// write and reports each write as a fraction of it; docs/benchmarks.md,
// "Writes against the machine's ceilings").
//
//   loaderx_write_ceiling raw --dir DIR --bytes N [--files K] [--chunk BYTES]
//                             [--repeat R]
//   loaderx_write_ceiling zstd --records FILE --ends FILE [--level L]
//                              [--dict FILE] [--threads T] [--repeat R]
//
// raw: writes N bytes from a buffer of N bytes in RAM (its pages touched
//      before the clock runs, as a writer's input is) split over K files, one
//      thread per file, each file written front to back with pwrite of
//      --chunk bytes, then fdatasync of each file and fsync of DIR, as a
//      store's publish does. Timed from after a sync() (what other work left dirty is not
//      charged) to the end of the fsyncs, then a sync() whose time is added
//      (it is near zero when the fsyncs did all the work). The best of R.
// zstd: compresses every record of FILE (records back to back; ENDS holds one
//      little-endian uint64 end offset per record) as its own frame, in a
//      tight loop on T threads (contiguous ranges of about equal bytes, one
//      context per thread with the store's frame parameters: magicless,
//      content size, no checksum, no dictionary id; level L or the CDict of
//      --dict), into one output buffer per thread that is written only by
//      the compressor. A record that would not shrink counts its own length
//      (a store keeps it raw); records of at most 6 bytes are not compressed
//      (no frame can be shorter). No I/O. The best of R.
//
// Prints one JSON object: seconds (best), samples (all), and for zstd the
// input and output bytes, the record count, cpu_seconds: the process's CPU
// time (all threads) of the best sample, and cpu_samples: that of each
// sample (bench/ceilings.py compares the median sample with the median write).
#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_c_format (magicless frames)
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "loaderx_write_ceiling: %s\n", what.c_str());
  std::exit(2);
}

// --name value pairs after the mode.
std::map<std::string, std::string> ParseArgs(int argc, char** argv) {
  std::map<std::string, std::string> a;
  for (int i = 2; i < argc; i += 2) {
    const std::string k = argv[i];
    if (k.rfind("--", 0) != 0 || i + 1 >= argc) Die("expected --name value, got '" + k + "'");
    a[k.substr(2)] = argv[i + 1];
  }
  return a;
}

uint64_t Num(const std::map<std::string, std::string>& a, const std::string& k, uint64_t dflt) {
  auto it = a.find(k);
  if (it == a.end()) return dflt;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(it->second.c_str(), &end, 10);
  if (end == it->second.c_str() || *end != '\0') Die("--" + k + " is not a number");
  return v;
}

std::string Need(const std::map<std::string, std::string>& a, const std::string& k) {
  auto it = a.find(k);
  if (it == a.end()) Die("--" + k + " is required");
  return it->second;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) Die("cannot open " + path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// CPU seconds of every thread of this process so far.
double ProcessCpuSeconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void PrintSamples(const std::vector<double>& s) {
  std::printf("\"seconds\": %.6f, \"samples\": [", *std::min_element(s.begin(), s.end()));
  for (size_t i = 0; i < s.size(); ++i) std::printf("%s%.6f", i ? ", " : "", s[i]);
  std::printf("]");
}

// ---- raw ---------------------------------------------------------------

double RawOnce(const std::string& dir, uint64_t bytes, uint64_t files, uint64_t chunk,
               const uint8_t* buf) {
  std::vector<std::string> paths;
  for (uint64_t f = 0; f < files; ++f) paths.push_back(dir + "/ceiling." + std::to_string(f));
  ::sync();
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (uint64_t f = 0; f < files; ++f) {
    threads.emplace_back([&, f] {
      const uint64_t share = bytes / files + (f < bytes % files ? 1 : 0);
      const uint8_t* src = buf + f * (bytes / files) + std::min(f, bytes % files);
      const int fd = ::open(paths[f].c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) Die("open " + paths[f] + ": " + std::strerror(errno));
      for (uint64_t at = 0; at < share;) {
        const ssize_t w =
            ::pwrite(fd, src + at, std::min(chunk, share - at), static_cast<off_t>(at));
        if (w <= 0) Die("pwrite " + paths[f] + ": " + std::strerror(errno));
        at += static_cast<uint64_t>(w);
      }
      if (::fdatasync(fd) != 0) Die("fdatasync: " + std::string(std::strerror(errno)));
      ::close(fd);
    });
  }
  for (auto& t : threads) t.join();
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0 || ::fsync(dfd) != 0) Die("fsync " + dir + ": " + std::strerror(errno));
  ::close(dfd);
  ::sync();
  const double s = Seconds(t0, Clock::now());
  for (const auto& p : paths) ::unlink(p.c_str());
  return s;
}

int Raw(const std::map<std::string, std::string>& a) {
  const std::string dir = Need(a, "dir");
  const uint64_t bytes = Num(a, "bytes", 0), files = Num(a, "files", 1);
  const uint64_t chunk = Num(a, "chunk", 8 << 20), repeat = Num(a, "repeat", 3);
  if (bytes == 0 || files == 0 || chunk == 0 || repeat == 0)
    Die("--bytes, --files, --chunk, --repeat > 0");
  // Not zeros (a file system may treat those specially); the page cache copies
  // whatever it is given at the same cost.
  std::vector<uint8_t> buf(bytes);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 2654435761U >> 13);
  std::vector<double> samples;
  for (uint64_t r = 0; r < repeat; ++r)
    samples.push_back(RawOnce(dir, bytes, files, chunk, buf.data()));
  std::printf("{\"mode\": \"raw\", \"bytes\": %llu, \"files\": %llu, \"chunk\": %llu, ",
              static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(files),
              static_cast<unsigned long long>(chunk));
  PrintSamples(samples);
  std::printf("}\n");
  return 0;
}

// ---- zstd --------------------------------------------------------------

struct CCtxFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};

struct Work {
  const uint8_t* data;
  const uint64_t* ends;
  uint64_t first, end;  // records [first, end)
};

// Compresses records [first, end) one frame each; returns the stored bytes.
uint64_t CompressRange(const Work& w, ZSTD_CCtx* c, uint8_t* out) {
  uint64_t pos = 0;  // the frames (and raw records) back to back: the stored bytes
  for (uint64_t k = w.first; k < w.end; ++k) {
    const uint64_t begin = k == 0 ? 0 : w.ends[k - 1];
    const uint64_t len = w.ends[k] - begin;
    uint64_t got = len;
    if (len > 6) {
      const size_t r = ZSTD_compress2(c, out + pos, ZSTD_compressBound(len), w.data + begin, len);
      if (ZSTD_isError(r)) Die(std::string("zstd: ") + ZSTD_getErrorName(r));
      got = std::min<uint64_t>(r, len);
    }
    pos += got;
  }
  return pos;
}

int Zstd(const std::map<std::string, std::string>& a) {
  const std::string data = ReadFile(Need(a, "records"));
  const std::string ends_bytes = ReadFile(Need(a, "ends"));
  const uint64_t n = ends_bytes.size() / 8;
  std::vector<uint64_t> ends(n);
  std::memcpy(ends.data(), ends_bytes.data(), n * 8);
  if (n == 0 || ends.back() != data.size()) Die("--ends does not end at the size of --records");
  const int level = static_cast<int>(Num(a, "level", 3));
  const uint64_t threads = Num(a, "threads", std::max(1U, std::thread::hardware_concurrency())),
                 repeat = Num(a, "repeat", 3);
  std::string dict;
  if (a.count("dict") != 0) dict = ReadFile(a.at("dict"));
  ZSTD_CDict* cdict = dict.empty() ? nullptr : ZSTD_createCDict(dict.data(), dict.size(), level);
  if (!dict.empty() && cdict == nullptr) Die("--dict is not a zstd dictionary");

  // Contiguous ranges of about equal bytes, one per thread.
  const auto* bytes = reinterpret_cast<const uint8_t*>(data.data());
  std::vector<Work> work;
  uint64_t k = 0;
  for (uint64_t t = 0; t < threads; ++t) {
    const uint64_t target = data.size() / threads * (t + 1);
    const uint64_t first = k;
    while (k < n && (t + 1 == threads || ends[k] <= target)) ++k;
    work.push_back({bytes, ends.data(), first, k});
  }
  std::vector<std::unique_ptr<ZSTD_CCtx, CCtxFree>> ctx;
  std::vector<std::unique_ptr<uint8_t[]>> out;
  for (const Work& w : work) {
    ZSTD_CCtx* c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_format, ZSTD_f_zstd1_magicless);
    ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1);
    ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 0);
    ZSTD_CCtx_setParameter(c, ZSTD_c_dictIDFlag, 0);
    if (cdict != nullptr) {
      ZSTD_CCtx_refCDict(c, cdict);
    } else {
      ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level);
    }
    ctx.emplace_back(c);
    uint64_t cap = 0;
    for (uint64_t r = w.first; r < w.end; ++r)
      cap += ZSTD_compressBound(ends[r] - (r ? ends[r - 1] : 0));
    out.emplace_back(new uint8_t[cap + 1]);
    std::memset(out.back().get(), 0, cap + 1);  // the pages exist before the clock runs
  }
  std::vector<double> samples, cpu;
  uint64_t stored = 0;
  for (uint64_t r = 0; r < repeat; ++r) {
    std::vector<uint64_t> got(work.size());
    const double c0 = ProcessCpuSeconds();
    const auto t0 = Clock::now();
    std::vector<std::thread> ts;
    for (size_t t = 0; t < work.size(); ++t) {
      ts.emplace_back([&, t] { got[t] = CompressRange(work[t], ctx[t].get(), out[t].get()); });
    }
    for (auto& t : ts) t.join();
    samples.push_back(Seconds(t0, Clock::now()));
    cpu.push_back(ProcessCpuSeconds() - c0);
    stored = 0;
    for (uint64_t g : got) stored += g;
  }
  ZSTD_freeCDict(cdict);
  std::printf(
      "{\"mode\": \"zstd\", \"level\": %d, \"threads\": %llu, \"records\": %llu, "
      "\"in_bytes\": %llu, \"out_bytes\": %llu, \"dict\": %s, \"cpu_seconds\": %.6f, "
      "\"cpu_samples\": [",
      level, static_cast<unsigned long long>(threads), static_cast<unsigned long long>(n),
      static_cast<unsigned long long>(data.size()), static_cast<unsigned long long>(stored),
      dict.empty() ? "false" : "true",
      cpu[std::min_element(samples.begin(), samples.end()) - samples.begin()]);
  for (size_t i = 0; i < cpu.size(); ++i) std::printf("%s%.6f", i ? ", " : "", cpu[i]);
  std::printf("], ");
  PrintSamples(samples);
  std::printf("}\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) Die("usage: loaderx_write_ceiling raw|zstd --name value ...");
  const std::string mode = argv[1];
  const auto args = ParseArgs(argc, argv);
  if (mode == "raw") return Raw(args);
  if (mode == "zstd") return Zstd(args);
  Die("unknown mode '" + mode + "' (raw or zstd)");
}
