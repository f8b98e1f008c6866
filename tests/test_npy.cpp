#include <backplane/backplane.hpp>

#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>

using namespace backplane;

namespace {
std::filesystem::path temp_file(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / "backplane_tests";
  std::filesystem::create_directories(dir);
  return dir / name;
}
}  // namespace

TEST_CASE("npy round-trips every dtype", "[npy]") {
  for (int d = 1; d < BP_DTYPE_COUNT_; ++d) {
    const auto dtype = static_cast<bp_dtype>(d);
    HostTensor t(dtype, {2, 3});
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, dtype == BP_DTYPE_BOOL ? i % 2 : static_cast<double>(i) - 2);
    const auto path = temp_file("rt_" + std::string(dtype_name(dtype)) + ".npy");
    write_npy(path, t);
    const HostTensor back = read_npy(path, dtype == BP_DTYPE_BF16 ? std::optional(BP_DTYPE_BF16) : std::nullopt);
    CHECK(back.dtype == dtype);
    CHECK(back.shape == t.shape);
    CHECK(back.bytes == t.bytes);
  }
}

TEST_CASE("npy reads a version 2.0 header and rejects bad files", "[npy]") {
  const auto path = temp_file("v2.npy");
  {
    std::string header = "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }";
    while ((12 + header.size() + 1) % 64) header += ' ';
    header += '\n';
    std::ofstream f(path, std::ios::binary);
    f.write("\x93NUMPY\x02\x00", 8);
    const uint32_t len = static_cast<uint32_t>(header.size());
    f.write(reinterpret_cast<const char*>(&len), 4);
    f << header;
    const int32_t v[3] = {7, -8, 9};
    f.write(reinterpret_cast<const char*>(v), sizeof v);
  }
  const HostTensor t = read_npy(path);
  CHECK(t.dtype == BP_DTYPE_I32);
  CHECK(t.get_int(1) == -8);

  const auto bad = temp_file("bad.npy");
  { std::ofstream(bad) << "not numpy"; }
  CHECK_THROWS_WITH(read_npy(bad), Catch::Contains("not a .npy file"));
  CHECK_THROWS_WITH(read_npy(temp_file("absent.npy")), Catch::Contains("cannot open"));
  // '<u2' is only bf16 when the graph says so.
  HostTensor b(BP_DTYPE_BF16, {2});
  write_npy(temp_file("bf.npy"), b);
  CHECK_THROWS_WITH(read_npy(temp_file("bf.npy")), Catch::Contains("bf16"));
}
