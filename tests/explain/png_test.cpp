// PNG heatmaps and the HTML token relevance: a written PNG decodes (stb_image) to the colormap's pixels.
#include "support/test_common.hpp"

#include <iattn/explain/png.hpp>

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

TEST_CASE("a heatmap PNG decodes to the colormap's pixels", "[explain][png]") {
  const fs::path dir = scratch_dir();
  MatD M(3, 4);
  M << 0, -1, 2, 4, 0.5, 1, -3, 0, 2, 2, 1, -4;  // |M| min 0, max 4
  write_heatmap_png((dir / "m.png").string(), M, {.cell = 2});
  const std::string bytes = slurp(dir / "m.png");
  int w = 0, h = 0, ch = 0;
  unsigned char* px = stbi_load_from_memory(reinterpret_cast<const unsigned char*>(bytes.data()), int(bytes.size()), &w, &h, &ch, 3);
  REQUIRE(px != nullptr);
  REQUIRE(w == 8);
  REQUIRE(h == 6);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const rgb expect = viridis(std::abs(M(y / 2, x / 2)) / 4.0);
      const unsigned char* p = px + (y * w + x) * 3;
      INFO("pixel " << x << ", " << y);
      REQUIRE(rgb{p[0], p[1], p[2]} == expect);
    }
  stbi_image_free(px);

  // with token labels: a white margin with black glyphs, the cells to its right and below
  const image img = heatmap_image(MatD(MatD::Identity(4, 4)), {.labels = {"the", "cat", "<s>", "sat"}});
  REQUIRE(img.width > 4 * 12);
  REQUIRE(img.height > 4 * 12);
  int black = 0;
  for (std::size_t i = 0; i < img.pixels.size(); i += 3) black += img.pixels[i] == 0 && img.pixels[i + 1] == 0 && img.pixels[i + 2] == 0;
  REQUIRE(black > 20);
  const int left = img.width - 4 * 12, top = img.height - 4 * 12;
  const std::uint8_t* p = img.pixels.data() + (std::size_t(top + 6) * std::size_t(img.width) + std::size_t(left + 6)) * 3;
  REQUIRE(rgb{p[0], p[1], p[2]} == viridis(1.0));  // the (0, 0) cell: the identity's maximum
  fs::remove_all(dir);
}

TEST_CASE("heatmaps reject bad input and leave no file behind", "[explain][png][errors]") {
  const fs::path dir = scratch_dir();
  MatD nan = MatD::Zero(3, 3);
  nan(1, 1) = std::nan("");
  REQUIRE_THROWS_AS(write_heatmap_png((dir / "nan.png").string(), nan), std::domain_error);
  REQUIRE_FALSE(fs::exists(dir / "nan.png"));
  REQUIRE_THROWS_WITH(write_heatmap_png((dir / "l.png").string(), MatD(MatD::Zero(3, 3)), {.labels = {"a", "b"}}), Contains("labels has 2 entries"));
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
