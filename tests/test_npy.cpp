#include <backplane/backplane.hpp>

#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <cstdio>
#include <fstream>

using namespace backplane;

namespace {
std::filesystem::path temp_file(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / "backplane_tests";
  std::filesystem::create_directories(dir);
  return dir / name;
}

// A .npy file with this header dict (padded as NumPy pads it) and payload.
std::filesystem::path raw_npy(const std::string& name, const std::string& dict, const std::string& payload,
                              int version = 1) {
  const auto path = temp_file(name);
  const size_t len_bytes = version == 1 ? 2 : 4;
  std::string header = dict;
  while ((8 + len_bytes + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write("\x93NUMPY", 6);
  f.put(static_cast<char>(version));
  f.put(0);
  const uint32_t len = static_cast<uint32_t>(header.size());
  f.write(reinterpret_cast<const char*>(&len), static_cast<std::streamsize>(len_bytes));
  f << header << payload;
  return path;
}

std::string error_of(const std::filesystem::path& path) {
  try {
    read_npy(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "accepted";
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

TEST_CASE("npy: the header dict is read by an exact grammar", "[npy]") {
  const std::string eight(8 * 4, '\0');  // 8 f32 zeros
  // Quotes of either kind, keys in any order, no trailing comma, spaces.
  auto t = read_npy(raw_npy("g1.npy", "{\"shape\": (2, 4), \"fortran_order\": False, \"descr\": \"<f4\"}", eight));
  CHECK(t.shape == Shape{2, 4});
  CHECK(t.dtype == BP_DTYPE_F32);
  t = read_npy(raw_npy("g2.npy", "{ 'descr' :'<f4','fortran_order':False,'shape':( 8 , ) , }", eight));
  CHECK(t.shape == Shape{8});
  t = read_npy(raw_npy("g3.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", eight));
  CHECK(t.shape == Shape{});
  CHECK(t.numel() == 1);
  t = read_npy(raw_npy("g4.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }", ""));
  CHECK(t.shape == Shape{0, 3});
  // NumPy under Python 2 wrote long dims as 3L.
  t = read_npy(raw_npy("g5.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 4L), }", eight));
  CHECK(t.shape == Shape{2, 4});
  // A header of ~30 KB (spaces inside the tuple): std::regex overflowed the stack on it.
  t = read_npy(raw_npy("g6.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (8," + std::string(30000, ' ') + "), }",
                       eight, 2));
  CHECK(t.shape == Shape{8});
}

TEST_CASE("npy: hostile headers are refused naming the file and the defect", "[npy]") {
  const std::string data(64, '\0');
  auto bad = [&](const std::string& name, const std::string& shape, const std::string& descr = "'<f4'",
                 const std::string& order = "False") {
    return error_of(raw_npy(name, "{'descr': " + descr + ", 'fortran_order': " + order + ", 'shape': " + shape + ", }", data));
  };
  // A negative dim was read as its absolute value, a float dim as two dims.
  CHECK_THAT(bad("neg.npy", "(-2, 4)"), Catch::Contains("neg.npy") && Catch::Contains("negative"));
  CHECK_THAT(bad("flt.npy", "(2.5, 4)"), Catch::Contains("flt.npy") && Catch::Contains("2.5") && Catch::Contains("integer"));
  CHECK_THAT(bad("exp.npy", "(2e3,)"), Catch::Contains("exp.npy") && Catch::Contains("integer"));
  // A dim beyond int64 was the bare message "stoll".
  CHECK_THAT(bad("big.npy", "(99999999999999999999, 4)"),
             Catch::Contains("big.npy") && Catch::Contains("99999999999999999999") && Catch::Contains("int64"));
  // Counts that overflow wrapped to a small or zero-byte tensor.
  CHECK_THAT(bad("ovf.npy", "(4611686018427387904, 4)"), Catch::Contains("ovf.npy") && Catch::Contains("overflows"));
  CHECK_THAT(bad("ovf2.npy", "(4294967296, 4294967296)"), Catch::Contains("ovf2.npy") && Catch::Contains("overflows"));
  CHECK_THAT(bad("rank.npy", "(1, 1, 1, 1, 1, 1, 1, 1, 1)"), Catch::Contains("rank.npy") && Catch::Contains("rank 9"));
  CHECK_THAT(bad("fort.npy", "(2, 4)", "'<f4'", "True"), Catch::Contains("fort.npy") && Catch::Contains("Fortran"));
  CHECK_THAT(bad("descr.npy", "(2, 4)", "'>f4'"), Catch::Contains("descr.npy") && Catch::Contains("'>f4'"));
  CHECK_THAT(bad("struct.npy", "(2,)", "[('a', '<f4')]"), Catch::Contains("struct.npy") && Catch::Contains("descr"));
  CHECK_THAT(bad("tuple.npy", "(3)"), Catch::Contains("tuple.npy") && Catch::Contains("(3,)"));
  CHECK_THAT(bad("order.npy", "(2, 4)", "'<f4'", "0"), Catch::Contains("order.npy") && Catch::Contains("fortran_order"));
  // Keys: each of the three exactly once, nothing else.
  CHECK_THAT(error_of(raw_npy("nokey.npy", "{'descr': '<f4', 'shape': (2,), }", data)),
             Catch::Contains("nokey.npy") && Catch::Contains("fortran_order"));
  CHECK_THAT(error_of(raw_npy("dupkey.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'shape': (-1,)}", data)),
             Catch::Contains("dupkey.npy") && Catch::Contains("twice"));
  CHECK_THAT(error_of(raw_npy("xkey.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", data)),
             Catch::Contains("xkey.npy") && Catch::Contains("'x'"));
  CHECK_THAT(error_of(raw_npy("tail.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} junk", data)),
             Catch::Contains("tail.npy") && Catch::Contains("after"));
  CHECK_THAT(error_of(raw_npy("quote.npy", "{'descr\": '<f4', 'fortran_order': False, 'shape': (2,)}", data)),
             Catch::Contains("quote.npy"));
  // A header over the 64 KiB cap (a version 2 header may claim 4 GiB).
  CHECK_THAT(error_of(raw_npy("long.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }" + std::string(70000, ' '),
                              data, 2)),
             Catch::Contains("long.npy") && Catch::Contains("64 KiB"));
}

TEST_CASE("npy: short data is found from the file size before allocating", "[npy]") {
  // 96 bytes claiming 1e12 f32 elements: a bare std::bad_alloc before.
  const auto huge = raw_npy("huge.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }", std::string(32, '\0'));
  CHECK_THAT(error_of(huge), Catch::Contains("huge.npy") && Catch::Contains("4000000000000 bytes") &&
                                 Catch::Contains("32 bytes"));
  // A few elements short.
  const auto few = raw_npy("few.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", std::string(8, '\0'));
  CHECK_THAT(error_of(few), Catch::Contains("few.npy") && Catch::Contains("12 bytes") && Catch::Contains("8 bytes"));
  // A header longer than the file.
  {
    std::ofstream f(temp_file("cut.npy"), std::ios::binary | std::ios::trunc);
    f.write("\x93NUMPY\x01\x00\x00\x10{'descr'", 18);
  }
  CHECK_THAT(error_of(temp_file("cut.npy")), Catch::Contains("cut.npy") && Catch::Contains("header"));
}

TEST_CASE("npy: a FIFO or a folder is refused without reading it", "[npy]") {
  const auto fifo = temp_file("fifo.npy");
  std::filesystem::remove(fifo);
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  // Opening a FIFO blocked until a writer came: `backplane run` hung.
  CHECK_THAT(error_of(fifo), Catch::Contains("fifo.npy") && Catch::Contains("is not a regular file"));
  std::filesystem::remove(fifo);
  const auto dir = temp_file("folder.npy");
  std::filesystem::create_directories(dir);
  CHECK_THAT(error_of(dir), Catch::Contains("folder.npy") && Catch::Contains("is not a regular file"));
}
