// PNG heatmaps and the HTML token relevance: a written PNG decodes (stb_image) to the colormap's
// pixels; the colorbar, masked diagonal, log scale, diverging colormap, title, ticks and layout
// formula are checked on the pixels; captions say what a map shows.
#include "support/test_common.hpp"

#include <iattn/explain/png.hpp>

#include <stb/stb_easy_font.h>
#include <stb/stb_image.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <unistd.h>

using namespace test;
using namespace iattn::explain;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {
fs::path scratch_dir() {
  const fs::path p = fs::temp_directory_path() / ("iattn_png_test_" + std::to_string(::getpid()));
  fs::create_directories(p);
  return p;
}
std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
const rgb white{255, 255, 255};
/// Each channel within `tol` of the other colour's.
bool near(rgb a, rgb b, int tol = 1) {
  for (int k = 0; k < 3; ++k)
    if (std::abs(int(a[std::size_t(k)]) - int(b[std::size_t(k)])) > tol) return false;
  return true;
}
/// The colour at the centre of entry (r, c).
rgb cell_colour(const image& img, const heatmap_layout& g, Index r, Index c) {
  return img.at(g.map_x + int(c) * g.cell + g.cell / 2, g.map_y + int(r) * g.cell + g.cell / 2);
}
int ink_in(const image& img, int x0, int y0, int x1, int y1) {
  int n = 0;
  for (int y = y0; y < y1; ++y)
    for (int x = x0; x < x1; ++x) n += img.at(x, y) != white;
  return n;
}
int easy_width(std::string s) { return stb_easy_font_width(s.data()) + 1; }  // the header's w(s)
}  // namespace

TEST_CASE("viridis endpoints and monotone lightness", "[explain][png]") {
  REQUIRE(viridis(0.0) == rgb{68, 1, 84});      // matplotlib's viridis(0) in 8 bits
  REQUIRE(viridis(1.0) == rgb{253, 231, 37});   // and viridis(1)
  REQUIRE(viridis(128.0 / 255.0) == rgb{33, 145, 140});  // entry 128 (0.127568, 0.566949, 0.550556)
  REQUIRE(viridis(-3.0) == viridis(0.0));
  REQUIRE(viridis(std::nan("")) == viridis(0.0));
  double last = -1;
  for (int i = 0; i <= 100; ++i) {  // green rises monotonically along viridis
    const rgb c = viridis(i / 100.0);
    REQUIRE(c[1] >= last);
    last = c[1];
  }
}

TEST_CASE("the diverging colormap is white at 0, symmetric, blue below and red above", "[explain][png]") {
  const rgb mid = diverging(0.5);
  REQUIRE(std::min({mid[0], mid[1], mid[2]}) >= 240);
  REQUIRE(diverging(std::nan("")) == mid);
  REQUIRE(diverging(-1.0) == diverging(0.0));
  REQUIRE(diverging(0.0)[2] > 2 * diverging(0.0)[0]);  // blue end
  REQUIRE(diverging(1.0)[0] > 2 * diverging(1.0)[2]);  // red end
  int last_sum = 3 * 255;
  for (int k = 0; k <= 64; ++k) {
    const double d = k / 128.0;
    const rgb up = diverging(0.5 + d), down = diverging(0.5 - d);
    INFO("distance " << d);
    REQUIRE(up == rgb{down[2], down[1], down[0]});  // mirrored: red and blue swap
    const int sum = up[0] + up[1] + up[2];
    REQUIRE(sum <= last_sum);  // darker away from 0
    last_sum = sum;
  }
}

TEST_CASE("an undecorated heatmap PNG decodes to the colormap's pixels", "[explain][png]") {
  const fs::path dir = scratch_dir();
  MatD M(3, 4);
  M << 0, -1, 2, 4, 0.5, 1, -3, 0, 2, 2, 1, -4;  // |M| min 0, max 4
  write_heatmap_png((dir / "m.png").string(), M, {.cell = 2, .ticks = false, .colorbar = false});
  const std::string bytes = slurp(dir / "m.png");
  int w = 0, h = 0, ch = 0;
  unsigned char* px = stbi_load_from_memory(reinterpret_cast<const unsigned char*>(bytes.data()), int(bytes.size()), &w, &h, &ch, 3);
  REQUIRE(px != nullptr);
  REQUIRE(w == 8);  // no title, ticks or colorbar: exactly the cells
  REQUIRE(h == 6);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const rgb expect = viridis(std::abs(M(y / 2, x / 2)) / 4.0);
      const unsigned char* p = px + (y * w + x) * 3;
      INFO("pixel " << x << ", " << y);
      REQUIRE(rgb{p[0], p[1], p[2]} == expect);
    }
  stbi_image_free(px);
  fs::remove_all(dir);
}

TEST_CASE("the colorbar runs through the colormap from the bottom value to the top", "[explain][png]") {
  MatD M(5, 5);
  for (Index i = 0; i < 25; ++i) M(i / 5, i % 5) = double(i) - 3;  // signed, |M| in [0, 21]
  for (const auto& o : {heatmap_options{.cell = 4}, heatmap_options{.cell = 20, .colormap = colormap_kind::diverging},
                        heatmap_options{.cell = 4, .normalize = false}, heatmap_options{.cell = 4, .scale = scale_kind::log}}) {
    const image img = heatmap_image(M, o);
    const heatmap_layout g = heatmap_geometry(M, o);
    REQUIRE(g.bar_w > 0);
    REQUIRE(g.bar_h == std::max(5 * o.cell, 40));
    const bool div = o.colormap == colormap_kind::diverging || !o.normalize;  // automatic: signed and unnormalised
    auto cmap = [&](double v) { return div ? diverging(v) : viridis(v); };
    const int x = g.bar_x + g.bar_w / 2;
    REQUIRE(img.at(x, g.bar_y) == cmap(1.0));
    REQUIRE(img.at(x, g.bar_y + g.bar_h - 1) == cmap(0.0));
    for (int y = 0; y < g.bar_h; ++y) REQUIRE(near(img.at(x, g.bar_y + y), cmap(1.0 - double(y) / (g.bar_h - 1))));
    REQUIRE(img.at(g.bar_x - 1, g.bar_y) != white);                                         // its frame
    REQUIRE(ink_in(img, g.bar_x + g.bar_w + 4, g.bar_y, img.width, g.bar_y + 9) > 5);       // the top value
    REQUIRE(ink_in(img, g.bar_x + g.bar_w + 4, g.bar_y + g.bar_h - 9, img.width, g.bar_y + g.bar_h) > 5);  // the bottom value
  }
  // the cells of the diverging map: m on [-21, 21], 0 white
  const heatmap_options o{.cell = 4, .colormap = colormap_kind::diverging};
  const image img = heatmap_image(M, o);
  const heatmap_layout g = heatmap_geometry(M, o);
  REQUIRE(cell_colour(img, g, 0, 3) == diverging(0.5));      // M = 0
  REQUIRE(cell_colour(img, g, 4, 4) == diverging(1.0));      // M = 21, the max |m|
  REQUIRE(cell_colour(img, g, 0, 0) == diverging(0.5 - 3.0 / 42));
}

TEST_CASE("a masked diagonal is grey and left out of the value range", "[explain][png]") {
  MatD M(6, 6);
  for (Index r = 0; r < 6; ++r)
    for (Index c = 0; c < 6; ++c) M(r, c) = r == c ? 1e6 : 1.0 + double(r * 6 + c) / 35.0;  // off-diagonal in [1, 2]
  const heatmap_options o{.cell = 6, .mask_diagonal = true};
  const image img = heatmap_image(M, o);
  const heatmap_layout g = heatmap_geometry(M, o);
  for (Index i = 0; i < 6; ++i) REQUIRE(cell_colour(img, g, i, i) == masked_grey);
  const double lo = M(0, 1), hi = M(5, 4);  // the off-diagonal min and max
  REQUIRE(cell_colour(img, g, 0, 1) == viridis(0.0));
  REQUIRE(cell_colour(img, g, 5, 4) == viridis(1.0));  // the full colormap off the diagonal
  REQUIRE(cell_colour(img, g, 2, 3) == viridis((M(2, 3) - lo) / (hi - lo)));
  // unmasked, the diagonal takes the top and everything else is squeezed to the bottom colour
  const heatmap_options u{.cell = 6};
  const image plain = heatmap_image(M, u);
  REQUIRE(cell_colour(plain, heatmap_geometry(M, u), 4, 5) == viridis(0.0));
  REQUIRE(cell_colour(plain, heatmap_geometry(M, u), 0, 0) == viridis(1.0));
  // a 1 x 1 map whose only entry is masked still draws
  REQUIRE_NOTHROW(heatmap_image(MatD(MatD::Ones(1, 1)), {.mask_diagonal = true}));
}

TEST_CASE("log scale: ten times smaller is a fixed step lower", "[explain][png]") {
  MatD M(1, 7);
  M << 2.0, 0.2, 0.02, 0.002, 0.0002, 0.00002, 0.0;  // top 2, floor 2e-4 (4 decades)
  const heatmap_options o{.cell = 4, .ticks = false, .scale = scale_kind::log, .log_floor = 1e-4};
  const image img = heatmap_image(M, o);
  const heatmap_layout g = heatmap_geometry(M, o);
  for (Index c = 0; c < 5; ++c) {
    INFO("entry " << c);
    REQUIRE(near(cell_colour(img, g, 0, c), viridis(1.0 - 0.25 * double(c))));  // 1/4 of the colormap per decade
  }
  REQUIRE(cell_colour(img, g, 0, 5) == viridis(0.0));  // below the floor
  REQUIRE(cell_colour(img, g, 0, 6) == viridis(0.0));  // zero
  // signs do not matter, and 3x smaller is log10(3)/4 lower wherever it sits
  MatD S(1, 3);
  S << -1.0, 1.0 / 3, -1.0 / 30;
  const image si = heatmap_image(S, o);
  const heatmap_layout sg = heatmap_geometry(S, o);
  REQUIRE(cell_colour(si, sg, 0, 0) == viridis(1.0));
  REQUIRE(near(cell_colour(si, sg, 0, 1), viridis(1.0 - std::log10(3.0) / 4)));
  REQUIRE(near(cell_colour(si, sg, 0, 2), viridis(0.75 - std::log10(3.0) / 4)));
  // unnormalised: the range is [log_floor, 1] whatever the data
  const heatmap_options f{.cell = 4, .ticks = false, .normalize = false, .scale = scale_kind::log, .log_floor = 1e-4};
  REQUIRE(near(cell_colour(heatmap_image(M, f), heatmap_geometry(M, f), 0, 1), viridis(1.0 - 0.25 * (-std::log10(0.2)))));
}

TEST_CASE("automatic colormap: diverging for signed maps with normalize off", "[explain][png]") {
  MatD S(2, 2);
  S << 0.5, -0.5, 0.0, 2.0;
  const heatmap_options off{.cell = 4, .normalize = false};
  const image a = heatmap_image(S, off);
  const heatmap_layout g = heatmap_geometry(S, off);
  REQUIRE(cell_colour(a, g, 0, 0) == diverging(0.75));  // m clamped to [-1, 1], 0.5 + m / 2
  REQUIRE(cell_colour(a, g, 0, 1) == diverging(0.25));
  REQUIRE(cell_colour(a, g, 1, 0) == diverging(0.5));
  REQUIRE(cell_colour(a, g, 1, 1) == diverging(1.0));
  // normalize on: |m| min-max on viridis, as before
  const heatmap_options on{.cell = 4};
  REQUIRE(cell_colour(heatmap_image(S, on), heatmap_geometry(S, on), 0, 1) == viridis(0.25));
  // non-negative and unnormalised: viridis clamped to [0, 1]
  const MatD P = S.cwiseAbs();
  REQUIRE(cell_colour(heatmap_image(P, off), heatmap_geometry(P, off), 0, 1) == viridis(0.5));
  // a signed map whose negative entry sits on the masked diagonal is not signed
  MatD D(2, 2);
  D << -1, 0.25, 0.5, -1;
  const heatmap_options m{.cell = 4, .mask_diagonal = true, .normalize = false};
  REQUIRE(cell_colour(heatmap_image(D, m), heatmap_geometry(D, m), 0, 1) == viridis(0.25));
}

TEST_CASE("title and tick labels are drawn where the layout puts them, and nowhere else", "[explain][png]") {
  const MatD M = MatD::Random(64, 64);
  const heatmap_options o{.title = "Mamba: H^c", .cell = 6};
  const image img = heatmap_image(M, o);
  const heatmap_layout g = heatmap_geometry(M, o);
  REQUIRE(g.step == 5);  // "63" is 13 pixels wide: 5 tokens (30 pixels) is the first nice step with room
  // the title: ink inside its centred box, none beside it
  const int tw = easy_width("Mamba: H^c"), tx = (img.width - tw) / 2;
  REQUIRE(ink_in(img, tx, g.title_y, tx + tw, g.title_y + 12) > 30);
  REQUIRE(ink_in(img, 0, 0, tx, g.title_y + g.title_h) == 0);
  REQUIRE(ink_in(img, tx + tw, 0, img.width, g.title_y + g.title_h) == 0);
  // the outer padding is blank
  REQUIRE(ink_in(img, 0, 0, img.width, 4) == 0);
  REQUIRE(ink_in(img, 0, img.height - 4, img.width, img.height) == 0);
  REQUIRE(ink_in(img, 0, 0, 4, img.height) == 0);
  REQUIRE(ink_in(img, img.width - 4, 0, img.width, img.height) == 0);
  // column labels 0, 5, ..., 60: ink only within each label's box, boxes apart
  const int band0 = g.map_y - 1 - 3 - 2 - 9, band1 = band0 + 9;
  std::vector<int> covered(std::size_t(img.width), 0);
  int prev_end = -100;
  for (int i = 0; i < 64; i += 5) {
    const int cx = g.map_x + i * 6 + 3, w = easy_width(std::to_string(i)), x0 = cx - w / 2;
    REQUIRE(x0 >= prev_end + 2);  // no overlap
    prev_end = x0 + w;
    REQUIRE(ink_in(img, x0, band0, x0 + w, band1) > 5);
    for (int x = x0; x < x0 + w; ++x) covered[std::size_t(x)] = 1;
  }
  for (int x = 0; x < img.width; ++x)
    if (!covered[std::size_t(x)]) REQUIRE(ink_in(img, x, band0, x + 1, band1) == 0);
  // row labels: ink left of the map at each labelled row's centre, none at rows between
  for (int i = 0; i < 64; i += 5) REQUIRE(ink_in(img, 4, g.map_y + i * 6 + 1, g.map_x - 4, g.map_y + i * 6 + 5) > 0);
  REQUIRE(ink_in(img, 0, g.map_y + 2 * 6 + 3, g.map_x - 1, g.map_y + 3 * 6 + 3) == 0);
  // without a title there is no band; without ticks neither labels nor marks
  REQUIRE(heatmap_geometry(M, {.cell = 6}).title_h == 0);
  const heatmap_options bare{.cell = 6, .ticks = false};
  const image plain = heatmap_image(M, bare);
  const heatmap_layout pg = heatmap_geometry(M, bare);
  REQUIRE(ink_in(plain, 0, 0, pg.map_x - 1, plain.height) == 0);
  REQUIRE(ink_in(plain, 0, 0, plain.width, pg.map_y - 1) == 0);
}

TEST_CASE("token labels are drawn, non-ASCII as '?', every n-th when cells are small", "[explain][png]") {
  const MatD I = MatD::Identity(4, 4);
  const heatmap_options o{.labels = {"the", "cat", "<s>", "\xc4\xa0sat"}};
  const image img = heatmap_image(I, o);
  const heatmap_layout g = heatmap_geometry(I, o);
  REQUIRE(g.cell == 12);
  REQUIRE(g.step == 1);
  REQUIRE(ink_in(img, 0, g.map_y, g.map_x - 1, g.map_y + 4 * 12) > 40);  // row labels
  REQUIRE(ink_in(img, g.map_x, 0, g.map_x + 4 * 12, g.map_y - 1) > 40);  // column labels, one glyph per line
  REQUIRE(cell_colour(img, g, 0, 0) == viridis(1.0));
  std::vector<std::string> many(40, "tok");
  REQUIRE(heatmap_geometry(MatD(MatD::Zero(40, 40)), {.cell = 4, .labels = many}).step == 5);  // 5 * 4 >= 12
}

TEST_CASE("image dimensions follow the documented formula", "[explain][png]") {
  const MatD M = MatD::Random(10, 10);  // |m| < 1: colorbar labels fit the reserved width
  const int B = easy_width("-8.88e-88"), tw = easy_width("a title");
  // title, ticks (rows 0 and 5 labelled) and colorbar
  const heatmap_layout g = heatmap_geometry(M, {.title = "a title", .cell = 5});
  const int R = easy_width("5"), T = 12 + 4, C = 9;
  REQUIRE(g.step == 5);  // the smallest of 1, 2, 5 with step * 5 >= max(12, 7 + 4)
  REQUIRE(g.map_x == 4 + R + 5 + 1);
  REQUIRE(g.map_y == 4 + T + C + 5 + 1);
  REQUIRE(g.bar_x == g.map_x + 50 + 1 + 8);
  REQUIRE(g.bar_h == 50);
  REQUIRE(g.width == std::max(g.bar_x + 12 + 4 + B + 4, tw + 8));
  REQUIRE(g.height == std::max(g.map_y + 50 + 1, g.bar_y + 50 + 1) + 4);
  // colorbar only, a small map: the bar's minimum height sets the image height
  const heatmap_layout s = heatmap_geometry(MatD(MatD::Ones(2, 3)), {.cell = 4, .ticks = false});
  REQUIRE(s.map_x == 5);
  REQUIRE(s.map_y == 5);
  REQUIRE(s.width == 5 + 12 + 1 + 8 + 12 + 4 + B + 4);
  REQUIRE(s.height == 5 + 40 + 1 + 4);
  // a long title widens the image
  const std::string long_title(120, 'x');
  REQUIRE(heatmap_geometry(MatD(MatD::Ones(2, 2)), {.title = long_title, .cell = 4}).width == easy_width(long_title) + 8);
  // and the drawn image has the geometry's size
  const image img = heatmap_image(M, {.title = "a title", .cell = 5});
  REQUIRE(img.width == g.width);
  REQUIRE(img.height == g.height);
}

TEST_CASE("captions say what a map is and how it is displayed", "[explain][png]") {
  MatD S(3, 3);
  S << 1, -2, 0, 0.5, 1, -1, 0, 0, 3;
  const MatD P = S.cwiseAbs();
  REQUIRE(heatmap_title({.model = "RetNet", .channels = 128}) == "RetNet: mean over 128 channels of H^c");
  REQUIRE(heatmap_caption({.model = "RetNet", .channels = 128}, S, {.mask_diagonal = true}) ==
          "RetNet: abs(mean over 128 channels of H^c), linear min-max, diagonal masked");
  REQUIRE(heatmap_caption({.model = "RetNet", .channels = 128}, P, {}) == "RetNet: mean over 128 channels of H^c, linear min-max");
  REQUIRE(heatmap_caption({.model = "Mamba", .channels = 512, .abs_mean = true}, P, {.scale = scale_kind::log}) ==
          "Mamba: mean of abs(H^c) over 512 channels, log10, 3 decades below the max");
  REQUIRE(heatmap_caption({.channel = 7}, S, {.normalize = false}) == "H^c, channel 7, signed, linear, diverging, clamped to [-1, 1]");
  REQUIRE(heatmap_caption({.channel = 7}, S, {.colormap = colormap_kind::diverging}, "\n") ==
          "H^c, channel 7\nsigned, linear, diverging on [-max, max]");
  REQUIRE(heatmap_caption({.what = "rollout over 4 layers"}, P, {.normalize = false, .scale = scale_kind::log, .log_floor = 1e-2}) ==
          "rollout over 4 layers, log10 on [0.01, 1]");
}

TEST_CASE("heatmaps reject bad input and options and leave no file behind", "[explain][png][errors]") {
  const fs::path dir = scratch_dir();
  const std::string p = (dir / "m.png").string();
  const MatD Z = MatD::Zero(3, 3);
  MatD nan = Z;
  nan(1, 1) = std::nan("");
  REQUIRE_THROWS_AS(write_heatmap_png((dir / "nan.png").string(), nan), std::domain_error);
  REQUIRE_FALSE(fs::exists(dir / "nan.png"));
  REQUIRE_THROWS_AS(write_heatmap_png(p, Z, {.cell = -1}), std::invalid_argument);
  REQUIRE_THROWS_WITH(write_heatmap_png(p, Z, {.cell = -1}), Contains("cell is -1"));
  REQUIRE_THROWS_WITH(write_heatmap_png(p, Z, {.cell = 100000}), Contains("cell is 100000"));
  REQUIRE_THROWS_WITH(write_heatmap_png(p, Z, {.tick_every = -2}), Contains("tick_every is -2"));
  REQUIRE_THROWS_AS(write_heatmap_png(p, Z, {.scale = scale_kind::log, .log_floor = 0}), std::invalid_argument);
  REQUIRE_THROWS_WITH(write_heatmap_png(p, Z, {.scale = scale_kind::log, .log_floor = 0}), Contains("log_floor is 0"));
  REQUIRE_THROWS_WITH(write_heatmap_png(p, Z, {.log_floor = -1e-3}), Contains("log_floor is -0.001"));
  REQUIRE_THROWS_WITH(write_heatmap_png(p, Z, {.log_floor = 1}), Contains("log_floor is 1"));
  REQUIRE_THROWS_WITH(write_heatmap_png(p, Z, {.scale = scale_kind::log, .colormap = colormap_kind::diverging}),
                      Contains("colormap is diverging but scale is log"));
  REQUIRE_THROWS_AS(write_heatmap_png(p, Z, {.labels = {"a", "b"}}), std::invalid_argument);
  REQUIRE_THROWS_WITH(write_heatmap_png(p, Z, {.labels = {"a", "b"}}), Contains("labels has 2 entries"));
  REQUIRE_THROWS_WITH(write_heatmap_png(p, MatD(MatD::Zero(2, 3)), {.labels = {"a", "b"}}), Contains("labels has 2 entries"));
  REQUIRE_THROWS_WITH(heatmap_caption({}, Z, {.cell = -3}), Contains("cell is -3"));
  REQUIRE_THROWS_WITH(write_heatmap_png((dir / "missing" / "m.png").string(), MatD(MatD::Zero(2, 2))), Contains("cannot open for writing"));
  REQUIRE(fs::is_empty(dir));
  fs::remove_all(dir);
}

TEST_CASE("token relevance HTML colours tokens by score and escapes them", "[explain][html]") {
  MatD s(1, 3);
  s << 0.0, 2.0, 1.0;
  const std::string html = token_relevance_html({"a<b", "cat", "&"}, s);
  REQUIRE_THAT(html, Contains("a&lt;b") && Contains("&amp;") && Contains("#fde725") && Contains("#440154"));
  REQUIRE(html.find("<b") == std::string::npos);  // the token's '<' is escaped
  REQUIRE_THROWS_WITH(token_relevance_html({"a", "b"}, s), Contains("scores has shape (1, 3)"));
}
