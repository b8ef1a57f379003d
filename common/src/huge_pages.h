// Huge pages for store data: the write unit of data files and the rule for
// advising MADV_HUGEPAGE on their mappings (docs/format.md, "Writing" and
// "How reads work").
//
// Why: a gather of small scattered records costs a TLB miss per record when
// the page cache is mapped in 4 KiB pages; mapped in 2 MiB pages, 512 times
// fewer entries cover the same bytes (docs/benchmarks.md). On Linux 6.x with
// large folios (ext4, xfs), a file's page cache is in 2 MiB folios when it
// was written in whole 2 MiB-aligned pieces (the writer does that) or read
// cold through a mapping advised MADV_HUGEPAGE, and a fault maps a 2 MiB
// folio with one PMD entry whether or not the mapping was advised.
//
// So the advice only changes how the part of a store that is not in the page
// cache is read back: a fault reads a whole 2 MiB folio instead of a 4 KiB
// page and its read-around. For a store that fits in RAM that reads each
// folio once and leaves the store PMD-mapped; for a store larger than RAM it
// would read 2 MiB per small record, over and over. The rule below keeps the
// advice to stores that fit comfortably.
//
// Private to common/. Thread-safety: pure functions, and MemAvailableBytes
// reads /proc/meminfo (no state).
#pragma once

#include <cstdint>

#include "loaderx/status.h"

namespace loaderx::hugepages {

// The unit of data-file writes: the PMD size of x86-64 and of arm64 with
// 4 KiB pages. (Elsewhere the writes are merely larger than needed.)
inline constexpr uint64_t kBytes = uint64_t{2} << 20;

// A store's data files may take at most 1/kRamShare of MemAvailable (read at
// open) for their mappings to be advised MADV_HUGEPAGE.
inline constexpr uint64_t kRamShare = 4;

// The rule: advise a data file's mapping iff the file holds at least one
// whole huge page and all of the store's data files together fit in
// 1/kRamShare of `mem_available` bytes. A heuristic: memory can fill up
// after the open, and the whole store is counted even where a job reads
// part of it.
inline bool ShouldAdvise(uint64_t file_bytes, uint64_t store_data_bytes, uint64_t mem_available) {
  return file_bytes >= kBytes && store_data_bytes <= mem_available / kRamShare;
}

// MemAvailable of /proc/meminfo, in bytes; an error if it cannot be read
// (then nothing is advised).
Result<uint64_t> MemAvailableBytes();

}  // namespace loaderx::hugepages
