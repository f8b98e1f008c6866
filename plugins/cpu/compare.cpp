// Comparisons (to bool) and where.
#include "eltwise_ops.hpp"

namespace backplane::cpu {
namespace {
using namespace eltwise;
using namespace eltwise::ops;

template <bp_dtype D> struct WhereK {
  static void impl(const Call& c) {
    c.expect(3, BP_PARAMS_NONE);
    map_where<st_t<D>>(c);
  }
};

}  // namespace

void register_compare(sdk::KernelTable& t) {
  const auto kcmp = [](bp_dtype d) { return std::vector<bp_dtype>{d, d, BP_DTYPE_BOOL}; };
  const auto kwhere = [](bp_dtype d) { return std::vector<bp_dtype>{BP_DTYPE_BOOL, d, d, d}; };
  const std::vector<uint8_t> s2{kStrided, kStrided}, s3{kStrided, kStrided, kStrided};
  add_rows<CompareK<Eq>::K, BP_CPU_ALL_DTYPES>(t, "eq", kcmp, s2);
  add_rows<CompareK<Ne>::K, BP_CPU_ALL_DTYPES>(t, "ne", kcmp, s2);
  add_rows<CompareK<Lt>::K, BP_CPU_ALL_DTYPES>(t, "lt", kcmp, s2);
  add_rows<CompareK<Le>::K, BP_CPU_ALL_DTYPES>(t, "le", kcmp, s2);
  add_rows<CompareK<Gt>::K, BP_CPU_ALL_DTYPES>(t, "gt", kcmp, s2);
  add_rows<CompareK<Ge>::K, BP_CPU_ALL_DTYPES>(t, "ge", kcmp, s2);
  add_rows<WhereK, BP_CPU_ALL_DTYPES>(t, "where", kwhere, s3);
}

}  // namespace backplane::cpu
