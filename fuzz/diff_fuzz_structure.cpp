// diff_fuzz's generator: views, reductions, softmax, matmul, concat, topk,
// var_mean and indexing nodes.
#include "diff_fuzz.hpp"

namespace diff_fuzz {

void Generator::view() {
  const Val* x = operand([](const Val&) { return true; });
  if (!x) return;
  const Val X = *x;
  const auto rank = static_cast<int>(X.shape.size());
  const int which = pick(0, 7);
  Json p = Json::object();
  std::string op;
  if (which == 0) {
    op = "reshape";
    p["shape"] = reshape_target(X);
  } else if (which == 1 && rank >= 1) {
    op = "permute";
    std::vector<int64_t> dims(static_cast<size_t>(rank));
    std::iota(dims.begin(), dims.end(), 0);
    std::shuffle(dims.begin(), dims.end(), rng_);
    if (chance(0.3)) dims[0] -= rank;  // a negative dim
    p["dims"] = dims;
  } else if (which == 2 && rank >= 2) {
    op = "transpose";
    p["dim0"] = pick(-rank, rank - 1);
    p["dim1"] = pick(-rank, rank - 1);
  } else if (which == 3) {
    op = "broadcast_to";
    Shape s = X.shape;
    for (auto& d : s)
      if (d == 1 && chance(0.6)) d = pick(2, 4);
    while (s.size() < 4 && chance(0.4)) s.insert(s.begin(), pick(1, 3));
    p["shape"] = s;
  } else if (which == 4 && rank >= 1) {
    op = "slice";
    const int d = pick(0, rank - 1);
    const int n = static_cast<int>(X.shape[static_cast<size_t>(d)]);
    p["dim"] = chance(0.3) ? d - rank : d;
    if (chance(0.7)) p["start"] = pick(-n - 2, n + 2);
    if (chance(0.7)) p["end"] = pick(-n - 2, n + 2);
    int step = pick(-3, 3);
    if (step == 0) step = 1;
    if (chance(0.5)) p["step"] = step;
  } else if (which == 5) {
    op = "squeeze";
    std::vector<int64_t> ones;
    for (int i = 0; i < rank; ++i)
      if (X.shape[static_cast<size_t>(i)] == 1 && chance(0.7)) ones.push_back(chance(0.3) ? i - rank : i);
    if (!ones.empty() && chance(0.7)) p["dims"] = ones;
  } else if (which == 6 && rank < 4) {
    op = "unsqueeze";
    p["dim"] = pick(-rank - 1, rank);
  } else {
    op = "contiguous";
  }
  add_node(op, op, {X.name}, p, X);
}

Json Generator::reshape_target(const Val& x) {
  const int64_t n = x.numel();
  std::vector<int64_t> dims;
  if (n == 0) {
    dims = chance(0.5) ? std::vector<int64_t>{0} : std::vector<int64_t>{pick(1, 3), 0};
    return dims;
  }
  int64_t rest = n;
  const int rank = pick(0, 4);
  for (int i = 0; i + 1 < rank; ++i) {
    std::vector<int64_t> divisors;
    for (int64_t d = 1; d <= rest; ++d)
      if (rest % d == 0) divisors.push_back(d);
    const int64_t d = divisors[static_cast<size_t>(pick(0, static_cast<int>(divisors.size()) - 1))];
    dims.push_back(d);
    rest /= d;
  }
  if (rank == 0 && rest != 1) dims.push_back(rest);
  else if (rank > 0) dims.push_back(rest);
  if (!dims.empty() && chance(0.3)) dims[static_cast<size_t>(pick(0, static_cast<int>(dims.size()) - 1))] = -1;
  return dims;
}

std::vector<int64_t> Generator::random_dims(int rank) {
  std::vector<int64_t> d;
  for (int i = 0; i < rank; ++i)
    if (chance(0.5)) d.push_back(chance(0.3) ? i - rank : i);
  std::shuffle(d.begin(), d.end(), rng_);
  return d;
}

int64_t Generator::reduced_count(const Val& x, const Json& dims) const {
  const auto rank = static_cast<int64_t>(x.shape.size());
  if (!dims.is_array()) return x.numel();
  int64_t n = 1;
  for (const auto& d : dims) {
    int64_t i = d.get<int64_t>();
    if (i < 0) i += rank;
    n *= x.shape[static_cast<size_t>(i)];
  }
  return n;
}

void Generator::reduce() {
  const Val* x = operand([](const Val& v) { return v.is_float() || v.is_int(); });
  if (!x) return;
  const Val X = *x;
  const auto rank = static_cast<int>(X.shape.size());
  std::vector<std::string> ops = {"sum", "max", "min", "prod"};
  if (X.is_float()) ops.push_back("mean");
  if (X.exact) ops.insert(ops.end(), {"argmax", "argmin"});
  const std::string op = one_of(ops);
  Json p = Json::object();
  if (op == "argmax" || op == "argmin") {
    if (rank == 0 && !scalar_dims_) return;
    if (rank == 0 && chance(0.5)) p["dim"] = 0;
    else if (rank > 0) p["dim"] = pick(-rank, rank - 1);
    else p["dim"] = -1;
    if (rank > 0) {
      int64_t d = p["dim"].get<int64_t>();
      if (X.shape[static_cast<size_t>(d < 0 ? d + rank : d)] == 0) return;  // an error by the docs
    }
    if (chance(0.3)) p["keepdim"] = true;
    if (chance(0.3)) p["select_last_index"] = true;
    Val m;
    m.dtype = BP_DTYPE_I64;
    m.lo = 0, m.hi = 64;
    add_node(op, op, {X.name}, p, m);
    return;
  }
  const auto dims = random_dims(rank);
  if (!dims.empty() || (rank > 0 && chance(0.3))) p["dims"] = dims.empty() ? Json(std::vector<int64_t>{rank - 1}) : Json(dims);
  if (chance(0.3)) p["keepdim"] = true;
  const int64_t n = reduced_count(X, p.value("dims", Json()));
  Val m = X;
  const double M = X.mag();
  if (X.is_int()) {
    if (op == "sum") m.lo = std::min(0.0, X.lo * n), m.hi = std::max(0.0, X.hi * n);
    if (op == "prod") m.lo = int_min(X.dtype), m.hi = int_max(X.dtype);
    if ((op == "max" || op == "min") && n == 0) return;
    add_node(op, op, {X.name}, p, m);
    return;
  }
  if (op == "max" || op == "min") {
    if (n == 0) return;  // an error by the docs
  } else if (op == "sum" || op == "mean") {
    m.lo = op == "mean" ? X.lo : std::min(0.0, X.lo) * static_cast<double>(n);
    m.hi = op == "mean" ? X.hi : std::max(0.0, X.hi) * static_cast<double>(n);
    if (n == 0) m.lo = 0, m.hi = 0, m.special = m.special || op == "mean";  // mean of nothing: NaN
    const bool pow2 = n > 0 && (n & (n - 1)) == 0;
    if (X.exact && fits_exact(M * static_cast<double>(n), X.gran) && (op == "sum" || pow2)) {
      if (op == "mean") m.gran = X.gran + static_cast<int>(std::log2(static_cast<double>(n)));
      if (!fits_exact(M, m.gran)) m.exact = false;
    } else {
      m.exact = false;
    }
    if (!m.exact) {
      const double dn = std::max<double>(static_cast<double>(n), 1);
      const double scale = op == "mean" ? 1 / dn : 1.0;
      if (X.lo >= 0 || X.hi <= 0) {  // one sign: relative
        m.ea = X.ea * dn * scale;
        m.er = X.er + 2 * kU * std::sqrt(dn) + (op == "mean" ? 2 * kU : 0);
      } else {
        m.ea = (X.abs_err() * dn + 2 * kU * std::sqrt(dn) * dn * M) * scale;
        m.er = 0;
      }
    }
  } else {  // prod
    const double bound = std::pow(std::max(M, 1.0), static_cast<double>(n));
    m.lo = -bound, m.hi = bound;
    if (X.lo >= 0) m.lo = 0;
    if (n > 8) return;
    m.gran = X.gran * static_cast<int>(n);
    if (!(X.exact && fits_exact(bound, m.gran))) {
      m.exact = false;
      m.ea = 0;
      m.er = static_cast<double>(n) * (X.rel_err() + kU);
      if (!(m.er < 1)) return;
    }
  }
  add_node(op, op, {X.name}, p, m);
}

void Generator::softmax_like() {
  const Val* x = operand([](const Val& v) { return (v.is_float() && !v.special) || v.is_int(); });
  if (!x) return;
  const Val X = *x;
  const auto rank = static_cast<int>(X.shape.size());
  if (rank == 0 && !scalar_dims_) return;
  const int dim = rank == 0 ? (chance(0.5) ? 0 : -1) : pick(-rank, rank - 1);
  const int64_t n = rank == 0 ? 1 : X.shape[static_cast<size_t>(dim < 0 ? dim + rank : dim)];
  if (X.is_int() || chance(0.25)) {
    // cumsum (ints wrap; floats: a running sum)
    Json p{{"dim", dim}};
    if (chance(0.3)) p["exclusive"] = true;
    if (chance(0.3)) p["reverse"] = true;
    Val m = X;
    const double dn = static_cast<double>(std::max<int64_t>(n, 1));
    m.lo = std::min(0.0, X.lo) * dn, m.hi = std::max(0.0, X.hi) * dn;
    if (X.is_float() && !(X.exact && fits_exact(m.mag(), X.gran))) {
      m.exact = false;
      if (X.lo >= 0 || X.hi <= 0) m.ea = X.ea * dn, m.er = X.er + 2 * kU * std::sqrt(dn);
      else m.ea = X.abs_err() * dn + 2 * kU * std::sqrt(dn) * dn * X.mag(), m.er = 0;
    }
    add_node("cumsum", "cumsum", {X.name}, p, m);
    return;
  }
  const bool log = chance(0.4);
  const double span = X.hi - X.lo, E = X.abs_err();
  if (span > 20) return;
  Val m = X;
  m.exact = false;
  const double dn = static_cast<double>(std::max<int64_t>(n, 1));
  if (!log) {
    m.lo = std::exp(-span) / dn, m.hi = 1;
    m.ea = 0;
    m.er = 2 * E + kU * span + 2 * kT + 2 * kU * std::sqrt(dn) + 6 * kU;
  } else {
    m.lo = -span - std::log(dn), m.hi = 0;
    m.ea = 2 * E + 2 * kU * span + kT + 2 * kU * std::sqrt(dn) + kU * std::log(dn);
    m.er = kU;
  }
  add_node(log ? "log_softmax" : "softmax", log ? "log_softmax" : "softmax", {X.name}, Json{{"dim", dim}}, m);
}

void Generator::matmul() {
  const Val* a = operand([](const Val& v) { return v.is_float() && !v.special && !v.shape.empty() && v.shape.size() <= 3; });
  if (!a) return;
  const Val A = *a;
  const int64_t K = A.shape.back();
  Shape bs;
  const int how = pick(0, 3);
  const int64_t N = pick(1, 5);
  if (how == 0) bs = {K};
  else if (how == 1 || A.shape.size() < 3) bs = {K, N};
  else bs = {chance(0.5) ? 1 : A.shape[0], K, N};
  const Val B = (chance(0.3) && K == A.shape.back() && A.shape.size() == 1) ? A : new_input(A.dtype, bs);
  const double Ma = A.mag(), Mb = B.mag(), dk = static_cast<double>(std::max<int64_t>(K, 1));
  Val m = A;
  m.hi = dk * Ma * Mb, m.lo = -m.hi;
  m.gran = A.gran + B.gran;
  m.exact = A.exact && B.exact && fits_exact(m.hi, m.gran);
  if (!m.exact) {
    if (A.lo >= 0 && B.lo >= 0) {
      m.lo = 0;
      m.ea = dk * (A.ea * Mb + B.ea * Ma);
      m.er = A.er + B.er + 2 * kU * std::sqrt(dk) + kU;
    } else {
      m.ea = dk * (A.abs_err() * Mb + B.abs_err() * Ma) + 2 * kU * std::sqrt(dk) * dk * Ma * Mb;
      m.er = 0;
    }
  }
  add_node("matmul", "matmul", {A.name, B.name}, Json::object(), m);
}

void Generator::attention() {
  const int64_t B = pick(1, 3), Sq = pick(1, 6), Sk = pick(1, 9), D = pick(1, 8), Dv = pick(1, 6);
  // Copies: new_input may move the values it returned before. The scores
  // must be exact (every intermediate may be an output, compared at the
  // tolerance): q, k and the mask dyadic, the scale a power of two.
  const Val Q = new_input(BP_DTYPE_F32, {B, Sq, D});
  const Val K = new_input(BP_DTYPE_F32, {B, Sk, D});
  const Val V = new_input(BP_DTYPE_F32, {B, Sk, Dv}, true);  // positive: the weighted mean never cancels
  if (!Q.exact || !K.exact) return;
  const double Mq = Q.mag(), Mk = K.mag(), dk = static_cast<double>(D);
  const Val* kt = add_node("kt", "transpose", {K.name}, Json{{"dim0", -2}, {"dim1", -1}}, K);
  if (!kt) return;
  Val ms = Q;
  ms.hi = dk * Mq * Mk, ms.lo = -ms.hi;
  ms.gran = Q.gran + K.gran;
  ms.exact = fits_exact(ms.hi, ms.gran);
  const Val* s = add_node("scores", "matmul", {Q.name, kt->name}, Json::object(), ms);
  if (!s) return;
  // Scores within [-2, 2] after the scale (a power of two: still exact), so
  // the softmax's span stays small.
  const int e = ms.hi > 2 ? static_cast<int>(std::ceil(std::log2(ms.hi / 2))) : 0;
  Val ma = ms;
  ma.hi = std::ldexp(ms.hi, -e), ma.lo = -ma.hi;
  ma.gran = ms.gran + e;
  ma.exact = fits_exact(ma.hi, ma.gran);
  const Val* x = add_node("scaled", "affine", {s->name}, Json{{"mul", std::ldexp(1.0, -e)}, {"add", 0.0}}, ma);
  if (!x) return;
  if (chance(0.6)) {
    const Shape ms_shape = one_of(std::vector<Shape>{{Sq, Sk}, {Sk}, {B, 1, Sk}, {1, Sq, Sk}, {B, Sq, Sk}});
    const Val X = *x;  // (new_input below may move the values x points into)
    const Val M = new_input(BP_DTYPE_F32, ms_shape);
    if (!M.exact) return;
    Val mm = X;
    mm.lo = X.lo + M.lo, mm.hi = X.hi + M.hi;
    mm.gran = std::max(X.gran, M.gran);
    mm.exact = fits_exact(std::max(std::fabs(mm.lo), std::fabs(mm.hi)), mm.gran);
    x = add_node("masked", "add", {X.name, M.name}, Json::object(), mm);
    if (!x) return;
  }
  const double span = x->hi - x->lo, E = x->abs_err(), dn = static_cast<double>(Sk);
  Val mp = *x;
  mp.exact = false;
  mp.lo = std::exp(-span) / dn, mp.hi = 1, mp.ea = 0;
  mp.er = 2 * E + kU * span + 2 * kT + 2 * kU * std::sqrt(dn) + 6 * kU;
  const Val* p = add_node("probs", "softmax", {x->name}, Json{{"dim", -1}}, mp);
  if (!p) return;
  // The fused kernels fold the scale and rescale partial sums: a few more
  // roundings per key block than the composed ops.
  Val my = V;
  my.exact = false;
  my.lo = V.lo * 0.99, my.hi = V.hi * 1.01;
  my.ea = V.abs_err() + V.mag() * (mp.er + 2 * kU * std::sqrt(dn) + 16 * kU), my.er = 0;
  add_node("attn", "matmul", {p->name, V.name}, Json::object(), my);
}

void Generator::concat() {
  const Val* a = operand([](const Val& v) { return !v.shape.empty() && v.dtype != BP_DTYPE_I64; });
  if (!a) return;
  const Val A = *a;
  const auto rank = static_cast<int>(A.shape.size());
  const int d = pick(0, rank - 1);
  std::vector<Val> parts = {A};
  const int extra = pick(1, 2);
  for (int i = 0; i < extra; ++i) {
    std::vector<const Val*> c;
    for (const auto& v : vals_) {
      if (v.dtype != A.dtype || v.shape.size() != A.shape.size()) continue;
      bool ok = true;
      for (int k = 0; k < rank; ++k) ok = ok && (k == d || v.shape[static_cast<size_t>(k)] == A.shape[static_cast<size_t>(k)]);
      if (ok) c.push_back(&v);
    }
    if (!c.empty() && chance(0.5)) {
      parts.push_back(*c[static_cast<size_t>(pick(0, static_cast<int>(c.size()) - 1))]);
    } else {
      Shape s = A.shape;
      s[static_cast<size_t>(d)] = pick(0, 3);
      parts.push_back(new_input(A.dtype, s));
    }
  }
  Val m = A;
  std::vector<std::string> names;
  for (const auto& p : parts) {
    names.push_back(p.name);
    m.lo = std::min(m.lo, p.lo), m.hi = std::max(m.hi, p.hi);
    m.exact = m.exact && p.exact;
    m.gran = std::max(m.gran, p.gran);
    m.special = m.special || p.special;
    m.ea = std::max(m.ea, p.ea), m.er = std::max(m.er, p.er);
  }
  if (!m.exact && A.is_float()) {
    // Mixed parts: the worst of their absolute drifts.
    double ea = 0;
    for (const auto& p : parts) ea = std::max(ea, p.abs_err());
    bool rel = true;
    double er = 0;
    for (const auto& p : parts) rel = rel && p.rel_err() < INFINITY, er = std::max(er, p.rel_err());
    if (rel) m.ea = 0, m.er = er;
    else m.ea = ea, m.er = 0;
  }
  add_node("concat", "concat", names, Json{{"dim", chance(0.3) ? d - rank : d}}, m);
}

void Generator::topk_or_var_mean() {
  if (chance(0.6)) {
    const Val* x = operand([](const Val& v) { return (v.is_float() || v.is_int()) && !v.shape.empty(); });
    if (!x) return;
    const Val X = *x;
    const auto rank = static_cast<int>(X.shape.size());
    const int dim = pick(-rank, rank - 1);
    const int64_t n = X.shape[static_cast<size_t>(dim < 0 ? dim + rank : dim)];
    Json p{{"k", pick(0, static_cast<int>(n))}};
    if (chance(0.7)) p["dim"] = dim;
    else p["k"] = pick(0, static_cast<int>(X.shape.back()));
    if (chance(0.4)) p["largest"] = false;
    const Val* t = add_node("topk", "topk", {X.name}, p, X, true);
    if (!t) return;
    const std::string tn = t->name;
    const Val values = X;
    add_node("values", chance(0.7) ? "view" : "view_owned", {tn}, Json{{"slot", 0}}, values);
    if (X.exact || chance(0.0)) {
      Val idx;
      idx.dtype = BP_DTYPE_I64;
      idx.lo = 0, idx.hi = static_cast<double>(n);
      if (chance(0.6)) add_node("indices", chance(0.7) ? "view" : "view_owned", {tn}, Json{{"slot", 1}}, idx);
    }
    return;
  }
  const Val* x = operand([](const Val& v) { return v.is_float() && !v.special; });
  if (!x) return;
  const Val X = *x;
  const auto rank = static_cast<int>(X.shape.size());
  Json p = Json::object();
  const auto dims = random_dims(rank);
  if (!dims.empty()) p["dims"] = dims;
  const double corr = one_of(std::vector<double>{0.0, 1.0, 0.5});
  if (corr != 1.0) p["correction"] = corr;
  if (chance(0.3)) p["keepdim"] = true;
  const int64_t n = reduced_count(X, p.value("dims", Json()));
  const double M = X.mag(), E = X.abs_err(), dn = static_cast<double>(std::max<int64_t>(n, 1));
  if (M > 2) return;
  const Val* t = add_node("var_mean", "var_mean", {X.name}, p, X, true);
  if (!t) return;
  const std::string tn = t->name;
  const bool empty_divisor = static_cast<double>(n) - corr <= 0;
  Val var = X;
  var.exact = false;
  var.lo = 0, var.hi = M * M * dn / std::max(static_cast<double>(n) - corr, 0.5);
  var.special = empty_divisor;
  var.ea = 4 * M * (kU * M + E) * dn / std::max(static_cast<double>(n) - corr, 0.5);
  var.er = 2 * kU * std::sqrt(dn) + 4 * kU;
  Val mean = X;
  mean.exact = false;
  mean.special = n == 0;
  mean.ea = E + 2 * kU * M * std::sqrt(dn);
  mean.er = 0;
  if (chance(0.7)) add_node("var", chance(0.7) ? "view" : "view_owned", {tn}, Json{{"slot", 0}}, var);
  if (chance(0.7)) add_node("mean", chance(0.7) ? "view" : "view_owned", {tn}, Json{{"slot", 1}}, mean);
}

void Generator::index() {
  if (scalar_dims_ && chance(0.1)) {
    // gather on a rank-0 input: index rank 0, dim 0 or -1.
    const Val* s = operand([](const Val& v) { return v.shape.empty() && v.dtype != BP_DTYPE_I64; });
    if (s) {
      const Val S = *s;
      const Val& idx = index_input({}, 1);
      add_node("gather", "gather", {S.name, idx.name}, Json{{"dim", chance(0.5) ? 0 : -1}}, S);
      return;
    }
  }
  const Val* x = operand([](const Val& v) { return !v.shape.empty() && v.dtype != BP_DTYPE_I64; });
  if (!x) return;
  const Val X = *x;
  const auto rank = static_cast<int>(X.shape.size());
  if (X.is_float() && !X.special && chance(0.3)) {
    // layer_norm over the trailing dims.
    const int k = pick(1, rank);
    std::vector<int64_t> dims;
    for (int i = rank - k; i < rank; ++i) dims.push_back(chance(0.3) ? i - rank : i);
    std::shuffle(dims.begin(), dims.end(), rng_);
    const Shape ns(X.shape.end() - k, X.shape.end());
    const double eps = one_of(std::vector<double>{0.1, 1.0});
    std::vector<std::string> ins = {X.name};
    double Mw = 1, Mb = 0;
    if (chance(0.5)) {
      const Val& w = new_input(X.dtype, ns);
      ins.push_back(w.name), Mw = w.mag();
    } else if (chance(0.5)) {
      ins.push_back("");
    }
    if (chance(0.3)) {
      if (ins.size() == 1) ins.push_back("");
      const Val& b = new_input(X.dtype, ns);
      ins.push_back(b.name), Mb = b.mag();
    }
    int64_t n = 1;
    for (auto d : ns) n *= d;
    const double dn = static_cast<double>(std::max<int64_t>(n, 1)), M = X.mag(), E = X.abs_err();
    if (M > 2) return;
    Val m = X;
    m.exact = false;
    m.special = false;
    const double z = std::sqrt(dn);  // the largest |normalized value|
    m.hi = z * Mw + Mb, m.lo = -m.hi;
    const double norm_abs = (2 * E + 2 * kU * M) / std::sqrt(eps) * (1 + 2 * kU * dn);
    const double norm_rel = 2 * kU * std::sqrt(dn) + kT + 4 * kU;
    m.ea = Mw * norm_abs + (Mb > 0 ? kU * m.hi + norm_rel * z * Mw : 0);
    m.er = Mb > 0 ? 0 : norm_rel + kU;
    Json inputs = Json::array();
    for (const auto& s : ins) inputs.push_back(s.empty() ? Json(nullptr) : Json(s));
    std::vector<std::string> names(ins.begin(), ins.end());
    add_node_nullable("layer_norm", names, Json{{"dims", dims}, {"eps", eps}}, m);
    return;
  }
  const int d = pick(0, rank - 1);
  const int64_t n = X.shape[static_cast<size_t>(d)];
  if (n == 0) return;
  if (chance(0.5)) {
    Shape is;
    const int irank = pick(0, 2);
    for (int i = 0; i < irank; ++i) is.push_back(pick(0, 4));
    const Val& idx = index_input(is, n);
    add_node("index_select", "index_select", {X.name, idx.name}, Json{{"dim", chance(0.3) ? d - rank : d}}, X);
  } else {
    Shape is = X.shape;
    for (int i = 0; i < rank; ++i)
      is[static_cast<size_t>(i)] = i == d ? pick(0, 5) : pick(0, static_cast<int>(X.shape[static_cast<size_t>(i)]));
    const Val& idx = index_input(is, n);
    add_node("gather", "gather", {X.name, idx.name}, Json{{"dim", chance(0.3) ? d - rank : d}}, X);
  }
}

}  // namespace diff_fuzz
