// MappedFile::drop_pages: pages of a live read-only mapping leave the resident set and read back the file's
// bytes; memory outside any mapping (the heap) is never touched.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/mapped_file.h"

namespace lathe {
namespace {

// Resident kB of the mapping that holds `p` (from /proc/self/smaps), or -1.
long resident_kb_of(const void* p) {
  std::ifstream in("/proc/self/smaps");
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') != std::string::npos &&
        line.find('-') < line.find(' ')) {
      inside = a >= lo && a < hi;
      continue;
    }
    if (inside && line.rfind("Rss:", 0) == 0) return std::stol(line.substr(4));
  }
  return -1;
}

TEST(MappedFileDrop, DroppedPagesReadBackTheFileAndLeaveTheResidentSet) {
  const auto path = std::filesystem::temp_directory_path() / ("lathe_drop_" + std::to_string(::getpid()));
  std::vector<unsigned char> bytes(4 << 20);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 131 + (i >> 12));
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  {
    const auto m = MappedFile::open(path.string());
    long sum = 0;
    for (size_t i = 0; i < m->size(); i += 4096) sum += m->data()[i];  // fault every page in
    EXPECT_GT(sum, 0);
    const long before = resident_kb_of(m->data());
    // Not page-aligned on either side: only the whole pages inside go.
    MappedFile::drop_pages(m->data() + 100, m->size() - 200);
    const long after = resident_kb_of(m->data());
    ASSERT_GE(before, 3 << 10);  // the 4 MiB were resident
    EXPECT_LT(after, before - 3 * 1024) << before << " -> " << after << " kB";
    EXPECT_EQ(std::memcmp(m->data(), bytes.data(), bytes.size()), 0);  // read back from the file
  }
  std::filesystem::remove(path);
}

TEST(MappedFileDrop, HeapMemoryIsLeftAlone) {
  std::vector<unsigned char> heap(1 << 20, 0xAB);
  MappedFile::drop_pages(heap.data(), heap.size());
  for (unsigned char b : heap) ASSERT_EQ(b, 0xAB);
}

}  // namespace
}  // namespace lathe
