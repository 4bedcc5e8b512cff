// iattn/explain/png.hpp: attention maps as PNG heatmaps (viridis), with optional token labels, and
// token relevance as a self-contained HTML snippet.
//
// PNG encoding is stb_image_write's (Debian's libstb-dev: link the `iattn::png` CMake target, which
// adds libstb); labels are drawn with stb_easy_font's 8-pixel glyphs. Writes are atomic
// (explain/io.hpp): a failed write leaves no file behind.
#pragma once

#include "../core/config.hpp"
#include "../core/error.hpp"
#include "colormap.hpp"
#include "io.hpp"
#include "methods.hpp"

#if __has_include(<stb/stb_image_write.h>)
#include <stb/stb_easy_font.h>
#include <stb/stb_image_write.h>
#else
#include <stb_easy_font.h>
#include <stb_image_write.h>
#endif

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace iattn::explain {

struct heatmap_options {
  int cell = 0;                     ///< pixels per matrix entry; 0: 512 / L clamped to [1, 16] (12 with labels)
  std::vector<std::string> labels = {};  ///< token labels for rows and columns (L of them, L <= 64), or none
  bool normalize = true;            ///< minmax_abs first (design.md's display normalisation); else clamp to [0, 1]
};

/// An RGB image, row-major, 3 bytes per pixel.
struct image {
  int width = 0, height = 0;
  std::vector<std::uint8_t> pixels;
  void fill_rect(int x0, int y0, int x1, int y1, rgb c) {
    for (int y = std::max(0, y0); y < std::min(height, y1); ++y)
      for (int x = std::max(0, x0); x < std::min(width, x1); ++x)
        std::copy(c.begin(), c.end(), pixels.begin() + (std::ptrdiff_t(y) * width + x) * 3);
  }
};

namespace detail {
/// Draws text with stb_easy_font's quads (axis-aligned rectangles) at (x, y), top-left.
inline void draw_text(image& img, int x, int y, const std::string& text, rgb colour) {
  std::vector<char> buf(text.begin(), text.end());
  buf.push_back('\0');
  std::vector<float> quads(buf.size() * 270 + 64);  // stb_easy_font: about 270 bytes of vertices per glyph
  const int n = stb_easy_font_print(float(x), float(y), buf.data(), nullptr, quads.data(), int(quads.size() * sizeof(float)));
  for (int q = 0; q < n; ++q) {
    const float* v = quads.data() + q * 16;  // 4 vertices of (x, y, z, colour) = 16 floats
    img.fill_rect(int(v[0]), int(v[1]), int(v[8]), int(v[9]), colour);
  }
}
inline std::string clip_label(const std::string& s, std::size_t n) { return s.size() <= n ? s : s.substr(0, n); }
}  // namespace detail

/// The heatmap image of a (rows, cols) map: one cell x cell square per entry, viridis colours.
template <class T>
image heatmap_image(const Matrix<T>& M, const heatmap_options& o = {}) {
  explain::detail::require_finite(M, "heatmap", "M");
  iattn::detail::require_shape(M.rows() >= 1 && M.cols() >= 1, "heatmap", "M", M.rows(), M.cols(), "(rows, cols) with rows, cols >= 1");
  const bool labelled = !o.labels.empty();
  if (labelled) {
    if (M.rows() != M.cols() || Index(o.labels.size()) != M.rows())
      iattn::detail::fail("heatmap", "labels has " + std::to_string(o.labels.size()) + " entries; expected one per token of the (" +
                                         std::to_string(M.rows()) + ", " + std::to_string(M.cols()) + ") map");
    if (M.rows() > 64) iattn::detail::fail("heatmap", "labels are drawn for L <= 64 only; L is " + std::to_string(M.rows()));
  }
  const Index L = std::max(M.rows(), M.cols());
  const int cell = o.cell > 0 ? o.cell : labelled ? 12 : int(std::clamp<Index>(512 / L, 1, 16));
  const Matrix<T> v = o.normalize ? minmax_abs(M) : Matrix<T>(M.cwiseMax(T(0)).cwiseMin(T(1)));
  const std::size_t max_chars = 8;
  int left = 0, top = 0;
  if (labelled) {
    std::size_t longest = 0;
    for (const auto& s : o.labels) longest = std::max(longest, std::min(s.size(), max_chars));
    left = int(longest) * 6 + 6;  // easy_font glyphs advance about 6 px
    top = int(longest) * 10 + 6;   // column labels: one glyph per line
  }
  image img;
  img.width = left + int(M.cols()) * cell;
  img.height = top + int(M.rows()) * cell;
  img.pixels.assign(std::size_t(img.width) * std::size_t(img.height) * 3, 255);
  for (Index r = 0; r < M.rows(); ++r)
    for (Index c = 0; c < M.cols(); ++c)
      img.fill_rect(left + int(c) * cell, top + int(r) * cell, left + int(c + 1) * cell, top + int(r + 1) * cell, viridis(double(v(r, c))));
  if (labelled) {
    const rgb black{0, 0, 0};
    for (Index i = 0; i < M.rows(); ++i) {
      const std::string s = detail::clip_label(o.labels[std::size_t(i)], max_chars);
      detail::draw_text(img, 2, top + int(i) * cell + (cell - 8) / 2, s, black);
      for (std::size_t k = 0; k < s.size(); ++k)
        detail::draw_text(img, left + int(i) * cell + (cell - 6) / 2, 2 + int(k) * 10, std::string(1, s[k]), black);
    }
  }
  return img;
}

/// PNG bytes of an image.
inline std::string encode_png(const image& img) {
  std::string out;
  auto sink = [](void* ctx, void* data, int size) { static_cast<std::string*>(ctx)->append(static_cast<const char*>(data), std::size_t(size)); };
  if (!stbi_write_png_to_func(sink, &out, img.width, img.height, 3, img.pixels.data(), img.width * 3))
    iattn::detail::fail("png", "encoding a " + std::to_string(img.width) + "x" + std::to_string(img.height) + " image failed");
  return out;
}

/// Writes M as a viridis heatmap PNG (see heatmap_options). Throws on bad input or an unwritable
/// path, leaving no file behind.
template <class T>
void write_heatmap_png(const std::string& path, const Matrix<T>& M, const heatmap_options& o = {}) {
  write_file_atomic(path, encode_png(heatmap_image(M, o)), "png");
}

namespace detail {
inline std::string html_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += ch;
    }
  }
  return out;
}
}  // namespace detail

/// Token relevance as a self-contained HTML snippet: each token in a span whose background is the
/// viridis colour of its score (scores min-max normalised), with the raw score in its title.
template <class T>
std::string token_relevance_html(const std::vector<std::string>& tokens, const Matrix<T>& scores) {
  iattn::detail::require_shape(scores.rows() == 1 && scores.cols() == Index(tokens.size()), "token_relevance_html", "scores", scores.rows(),
                               scores.cols(), "(1, " + std::to_string(tokens.size()) + "), one score per token");
  const Matrix<T> v = minmax_abs(scores);
  std::string html = "<div class=\"iattn-relevance\" style=\"font-family:monospace;line-height:1.9\">";
  char buf[160];
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const rgb c = viridis(double(v(0, Index(i))));
    const double luma = 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
    std::snprintf(buf, sizeof buf, "<span title=\"%.6g\" style=\"background:#%02x%02x%02x;color:%s;padding:1px 2px;margin:0 1px\">",
                  double(scores(0, Index(i))), c[0], c[1], c[2], luma > 140 ? "#000" : "#fff");
    html += buf + detail::html_escape(tokens[i]) + "</span>";
  }
  return html + "</div>\n";
}

/// Writes a text file (an HTML page or snippet) atomically.
inline void write_text(const std::string& path, const std::string& text) { write_file_atomic(path, text, "write_text"); }

}  // namespace iattn::explain
