// Layouts and view ops against hand-derived strides and NumPy's rules.
#include <backplane/backplane.hpp>

#include <catch2/catch.hpp>

using backplane::Error;
using backplane::Layout;
using backplane::Shape;

TEST_CASE("contiguous layouts are row-major", "[layout]") {
  const Layout l = Layout::contiguous({2, 3, 4});
  CHECK(l.strides() == std::vector<int64_t>{12, 4, 1});
  CHECK(l.numel() == 24);
  CHECK(l.is_contiguous());
  CHECK(Layout::contiguous({}).numel() == 1);
  CHECK(Layout::contiguous({3, 0, 2}).numel() == 0);
}

TEST_CASE("permute and transpose reorder strides", "[layout]") {
  const Layout l = Layout::contiguous({2, 3, 4}).permute({2, 0, 1});
  CHECK(l.shape() == Shape{4, 2, 3});
  CHECK(l.strides() == std::vector<int64_t>{1, 12, 4});
  CHECK_FALSE(l.is_contiguous());
  const Layout t = Layout::contiguous({2, 3}).transpose(-1, 0);
  CHECK(t.shape() == Shape{3, 2});
  CHECK(t.strides() == std::vector<int64_t>{1, 3});
  CHECK_THROWS_AS(Layout::contiguous({2, 3}).permute({0, 0}), Error);
  CHECK_THROWS_AS(Layout::contiguous({2, 3}).permute({0}), Error);
}

TEST_CASE("broadcast_to gives stride 0 to stretched dims", "[layout]") {
  const Layout l = Layout::contiguous({3, 1}).broadcast_to({2, 3, 4});
  CHECK(l.shape() == Shape{2, 3, 4});
  CHECK(l.strides() == std::vector<int64_t>{0, 1, 0});
  CHECK_THROWS_WITH(Layout::contiguous({3, 2}).broadcast_to({3, 4}), Catch::Contains("cannot broadcast"));
}

TEST_CASE("slice follows NumPy clamping, including negative steps", "[layout]") {
  const Layout base = Layout::contiguous({10});
  auto s = base.slice(0, 2, 8, 3);  // 2, 5
  CHECK(s.shape() == Shape{2});
  CHECK(s.offset() == 2);
  CHECK(s.strides()[0] == 3);
  s = base.slice(0, std::nullopt, std::nullopt, -1);  // 9..0
  CHECK(s.shape() == Shape{10});
  CHECK(s.offset() == 9);
  CHECK(s.strides()[0] == -1);
  s = base.slice(0, -3, -100, -2);  // 7, 5, 3, 1
  CHECK(s.shape() == Shape{4});
  CHECK(s.offset() == 7);
  s = base.slice(0, 100, 200, 1);  // empty
  CHECK(s.shape() == Shape{0});
  s = base.slice(0, -100, 3, 1);  // 0, 1, 2
  CHECK(s.shape() == Shape{3});
  CHECK(s.offset() == 0);
  CHECK_THROWS_AS(base.slice(0, 0, 1, 0), Error);
  const Layout m = Layout::contiguous({4, 5}).slice(1, 1, 5, 2);  // columns 1, 3
  CHECK(m.shape() == Shape{4, 2});
  CHECK(m.strides() == std::vector<int64_t>{5, 2});
  CHECK(m.offset() == 1);
  CHECK(m.extent() == std::pair<int64_t, int64_t>{1, 18});
}

TEST_CASE("squeeze and unsqueeze", "[layout]") {
  const Layout l = Layout::contiguous({1, 3, 1});
  CHECK(l.squeeze(std::nullopt).shape() == Shape{3});
  CHECK(l.squeeze(std::vector<int64_t>{-1}).shape() == Shape{1, 3});
  CHECK_THROWS_WITH(l.squeeze(std::vector<int64_t>{1}), Catch::Contains("not 1"));
  CHECK(Layout::contiguous({3}).unsqueeze(-1).shape() == Shape{3, 1});
  CHECK(Layout::contiguous({3}).unsqueeze(0).shape() == Shape{1, 3});
}

TEST_CASE("reshape is a view when strides allow it, else asks for a copy", "[layout]") {
  const Layout c = Layout::contiguous({2, 3, 4});
  auto r = c.reshape({6, 4});
  REQUIRE(r);
  CHECK(r->strides() == std::vector<int64_t>{4, 1});
  // A transposed tensor cannot be flattened without a copy.
  const Layout t = Layout::contiguous({3, 4}).transpose(0, 1);
  CHECK_FALSE(t.reshape({12}));
  // But splitting one of its dims is a view.
  auto split = t.reshape({2, 2, 3});
  REQUIRE(split);
  CHECK(split->strides() == std::vector<int64_t>{2, 1, 4});
  // A sliced row-block stays viewable.
  const Layout rows = Layout::contiguous({4, 6}).slice(0, 1, 3, 1);
  auto rr = rows.reshape({12});
  REQUIRE(rr);
  CHECK(rr->offset() == 6);
  CHECK_THROWS_AS(c.reshape({5, 5}), Error);
}
