// iattn/explain/png.hpp: attention maps as PNG heatmaps, with a title, token ticks and a colorbar,
// titles and captions that say what a map is, and token relevance as a self-contained HTML snippet.
//
// PNG encoding is stb_image_write's (Debian's libstb-dev: link the `iattn::png` CMake target, which
// adds libstb); text is drawn with stb_easy_font's glyphs (at most 8 x 9 pixels, 12-pixel lines).
// Writes are atomic (explain/io.hpp): a failed write leaves no file behind.
//
// What a map displays (m an entry of M; a = max |m| and the min/max over the entries shown, i.e.
// without the diagonal when it is masked; the colorbar prints its bottom, middle and top values in
// M's units, |M|'s where the map takes abs):
//
//   scale   colormap    normalize = true (default)             normalize = false
//   linear  viridis     |m| on [min |m|, max |m|] (minmax_abs)  m clamped to [0, 1]
//   linear  diverging   m on [-a, a], white at 0               m clamped to [-1, 1], white at 0
//   log     viridis     log10 |m| on [a * log_floor, a]         log10 |m| on [log_floor, 1]
//   log     diverging   rejected (a log scale has no sign)
//
// colormap = automatic (the default) is diverging when the scale is linear, normalize is off and
// the shown entries have both signs; viridis otherwise. Masked diagonal cells are neutral grey.
//
// Layout (pixels; w(s) = stb_easy_font_width(s) + 1; nothing overlaps; decorated = a title, ticks
// or a colorbar; an undecorated map is exactly cols*cell x rows*cell):
//
//   pad = 4, frame = 1 (a grey line around the map and the bar) when decorated, else 0
//   title band  T = 12 * lines + 4 with a title, else 0; the lines are centred
//   ticks       row labels right-aligned in a column of width R = max w(row label), then a gap of
//               2 and a 3-pixel tick mark; column labels in a band of height C = 9 (indices,
//               centred on their column) or 10 * (longest label - 1) + 9 (token labels, one glyph
//               per line), then 2 + 3; every `step`-th token is labelled (tick_every, or the
//               smallest of 1, 2, 5, 10, 20, 50, ... with step * cell >= max(12, w(widest) + 4))
//   map_x = pad + (ticks ? R + 5 : 0) + frame,  map_y = pad + T + (ticks ? C + 5 : 0) + frame
//   colorbar    bar_x = map_x + cols*cell + frame + 8, bar_y = map_y, 12 wide,
//               bar_h = max(rows*cell, 40); labels 4 pixels right of the bar, reserving
//               B = max(w("-8.88e-88"), widest label)
//   width  = max(right edge + pad, widest title line + 2 pad), right edge = bar_x + 12 + 4 + B with
//            a colorbar, else max(map_x + cols*cell + frame, right end of the last column label)
//   height = max(map_y + rows*cell + frame, bar_y + bar_h + 1, bottom of the last row label) + pad
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
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace iattn::explain {

enum class colormap_kind { automatic, viridis, diverging };
enum class scale_kind { linear, log };

struct heatmap_options {
  std::string title = {};                ///< drawn centred above the map ('\n' breaks lines); empty: no title band
  int cell = 0;                          ///< pixels per matrix entry; 0: 512 / L clamped to [1, 16] (12 with labels)
  std::vector<std::string> labels = {};  ///< token labels for rows and columns (L of them, clipped to 8 characters), or none
  bool ticks = true;                     ///< tick labels on both axes: `labels`, or token indices when there are none
  int tick_every = 0;                    ///< label every n-th token; 0: the smallest n in 1, 2, 5, 10, ... that does not overlap
  bool colorbar = true;                  ///< a bar right of the map with its bottom, middle and top values printed
  bool mask_diagonal = false;            ///< the main diagonal in neutral grey, left out of the value range
  bool normalize = true;                 ///< the colour range from the data (see the table above); else a fixed range
  scale_kind scale = scale_kind::linear; ///< linear, or log10 |m| (see log_floor)
  double log_floor = 1e-3;               ///< log scale: the range is [top * log_floor, top], in (0, 1); 1e-3 is 3 decades
  colormap_kind colormap = colormap_kind::automatic;  ///< viridis, diverging, or automatic (diverging for signed maps unnormalised)
};

/// The neutral grey of masked diagonal cells (in neither colormap).
inline constexpr rgb masked_grey{128, 128, 128};

/// An RGB image, row-major, 3 bytes per pixel, white where nothing is drawn.
struct image {
  int width = 0, height = 0;
  std::vector<std::uint8_t> pixels;
  void fill_rect(int x0, int y0, int x1, int y1, rgb c) {
    for (int y = std::max(0, y0); y < std::min(height, y1); ++y)
      for (int x = std::max(0, x0); x < std::min(width, x1); ++x)
        std::copy(c.begin(), c.end(), pixels.begin() + (std::ptrdiff_t(y) * width + x) * 3);
  }
  rgb at(int x, int y) const {
    const auto* p = pixels.data() + (std::ptrdiff_t(y) * width + x) * 3;
    return {p[0], p[1], p[2]};
  }
};

/// Where a heatmap's parts lie in its image (the formulas at the top of this header).
struct heatmap_layout {
  int width = 0, height = 0;            ///< the image
  int cell = 0;                         ///< pixels per entry
  int map_x = 0, map_y = 0;             ///< top-left pixel of entry (0, 0)
  int title_y = 0, title_h = 0;         ///< the title band (title_h = 0: none)
  int bar_x = 0, bar_y = 0, bar_w = 0, bar_h = 0;  ///< the colorbar's colours (bar_w = 0: none)
  int step = 0;                         ///< tick labels every `step` tokens (0: no ticks)
};

namespace detail {
inline constexpr int pad = 4, line_h = 12, glyph_h = 9, tick_len = 3, tick_gap = 2, bar_w = 12, bar_gap = 8, min_bar_h = 40;
inline constexpr rgb ink{0, 0, 0}, frame_grey{160, 160, 160};

/// Printable ASCII only: stb_easy_font indexes its tables by (ch - 32), so anything else becomes '?'.
inline std::string printable(const std::string& s) {
  std::string out = s;
  for (char& ch : out)
    if (ch < 32 || ch > 126) ch = '?';
  return out;
}
/// Width in pixels of one line of text, the last glyph's overhang included.
inline int text_width(const std::string& s) {
  if (s.empty()) return 0;
  std::string t = printable(s);
  return stb_easy_font_width(t.data()) + 1;
}
/// Draws one line of text with stb_easy_font's quads (axis-aligned rectangles), top-left at (x, y).
inline void draw_text(image& img, int x, int y, const std::string& text, rgb colour) {
  std::string buf = printable(text);
  std::vector<float> quads(buf.size() * 270 + 64);  // stb_easy_font: about 270 bytes of vertices per glyph
  const int n = stb_easy_font_print(float(x), float(y), buf.data(), nullptr, quads.data(), int(quads.size() * sizeof(float)));
  for (int q = 0; q < n; ++q) {
    const float* v = quads.data() + q * 16;  // 4 vertices of (x, y, z, colour) = 16 floats
    img.fill_rect(int(v[0]), int(v[1]), int(v[8]), int(v[9]), colour);
  }
}
inline std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out(1);
  for (char ch : s) {
    if (ch == '\n') out.emplace_back();
    else out.back().push_back(ch);
  }
  return out;
}
inline std::string clip_label(const std::string& s, std::size_t n) { return s.size() <= n ? s : s.substr(0, n); }
inline std::string format_value(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v == 0 ? 0.0 : v);  // no "-0"
  return buf;
}

/// How entries become colours: the resolved colormap and the colour range (the table above).
struct display {
  colormap_kind cmap = colormap_kind::viridis;  ///< viridis or diverging, never automatic
  scale_kind scale = scale_kind::linear;
  bool normalize = true, mask = false;
  double lo = 0, hi = 1;   ///< the colorbar's bottom and top, in M's units (|M|'s for log)
  double floor_rel = 1e-3;
  bool signed_entries = false;  ///< some shown entry is negative
  bool takes_abs() const { return scale == scale_kind::log || (cmap == colormap_kind::viridis && normalize); }
  /// The colormap position in [0, 1] of an entry m.
  double position(double m) const {
    if (scale == scale_kind::log) {
      const double a = std::abs(m);
      if (!(hi > 0) || !(a > lo)) return 0;
      return std::clamp(std::log10(a / hi) / -std::log10(floor_rel) + 1, 0.0, 1.0);
    }
    if (cmap == colormap_kind::diverging) return hi > 0 ? std::clamp(0.5 + 0.5 * m / hi, 0.0, 1.0) : 0.5;
    if (normalize) return hi > lo ? (std::abs(m) - lo) / (hi - lo) : 0.0;
    return std::clamp(m, 0.0, 1.0);
  }
  /// The value (in the colorbar's units) at colormap position p: the colorbar's labels.
  double value_at(double p) const { return scale == scale_kind::log ? hi * std::pow(floor_rel, 1 - p) : lo + p * (hi - lo); }
  rgb colour(double p) const { return cmap == colormap_kind::diverging ? diverging(p) : viridis(p); }
};

/// Checks the options against an (rows, cols) map; throws std::invalid_argument naming the option.
inline void check_options(Index rows, Index cols, const heatmap_options& o) {
  auto bad = [](const std::string& what) { iattn::detail::fail("heatmap", what); };
  if (o.cell < 0) bad("cell is " + std::to_string(o.cell) + "; expected 0 (automatic) or a positive pixel count");
  if (o.tick_every < 0) bad("tick_every is " + std::to_string(o.tick_every) + "; expected 0 (automatic) or a positive token count");
  if (!(o.log_floor > 0 && o.log_floor < 1))
    bad("log_floor is " + format_value(o.log_floor) + "; expected a fraction of the top value in (0, 1), e.g. 1e-3 for 3 decades");
  if (o.scale == scale_kind::log && o.colormap == colormap_kind::diverging)
    bad("colormap is diverging but scale is log: a log scale shows log10 |M|, which has no sign; use viridis or automatic");
  if (!o.labels.empty() && (rows != cols || Index(o.labels.size()) != rows))
    bad("labels has " + std::to_string(o.labels.size()) + " entries; expected one per token of the (" + std::to_string(rows) + ", " +
        std::to_string(cols) + ") map");
}

template <class T>
display resolve(const Matrix<T>& M, const heatmap_options& o) {
  double mn = std::numeric_limits<double>::infinity(), mx = -mn, amin = mn, amax = 0;
  bool any = false;
  for (Index r = 0; r < M.rows(); ++r)
    for (Index c = 0; c < M.cols(); ++c) {
      if (o.mask_diagonal && r == c) continue;
      const double v = double(M(r, c));
      any = true;
      mn = std::min(mn, v), mx = std::max(mx, v);
      amin = std::min(amin, std::abs(v)), amax = std::max(amax, std::abs(v));
    }
  if (!any) mn = mx = amin = amax = 0;  // a 1 x 1 map with its diagonal masked
  display d;
  d.scale = o.scale, d.normalize = o.normalize, d.mask = o.mask_diagonal, d.floor_rel = o.log_floor, d.signed_entries = mn < 0;
  d.cmap = o.colormap != colormap_kind::automatic ? o.colormap
           : (o.scale == scale_kind::linear && !o.normalize && mn < 0 && mx > 0) ? colormap_kind::diverging
                                                                                 : colormap_kind::viridis;
  if (d.scale == scale_kind::log) {
    d.hi = o.normalize ? amax : 1.0;
    d.lo = d.hi * o.log_floor;
  } else if (d.cmap == colormap_kind::diverging) {
    d.hi = o.normalize ? amax : 1.0;
    d.lo = -d.hi;
  } else {
    d.lo = o.normalize ? amin : 0.0;
    d.hi = o.normalize ? amax : 1.0;
  }
  return d;
}

/// The smallest of 1, 2, 5, 10, 20, 50, ... with step * cell >= need pixels.
inline int nice_step(int cell, int need) {
  for (long s = 1;; s *= 10)
    for (long m : {1L, 2L, 5L})
      if (s * m * cell >= need || s * m >= (1L << 30)) return int(s * m);
}

inline std::string tick_text(const heatmap_options& o, Index i) {
  return o.labels.empty() ? std::to_string(i) : clip_label(o.labels[std::size_t(i)], 8);
}

inline heatmap_layout layout(Index rows, Index cols, const heatmap_options& o, const std::array<std::string, 3>& bar_labels) {
  heatmap_layout g;
  const Index L = std::max(rows, cols);
  const bool labelled = !o.labels.empty();
  g.cell = o.cell > 0 ? o.cell : labelled ? 12 : int(std::clamp<Index>(512 / L, 1, 16));
  const bool decorated = !o.title.empty() || o.ticks || o.colorbar;
  const int pad_ = decorated ? pad : 0, frame = decorated ? 1 : 0;
  const Index map_w = cols * g.cell, map_h = rows * g.cell;
  if (map_w > 32768 || map_h > 32768)
    iattn::detail::fail("heatmap", "cell is " + std::to_string(g.cell) + ", which makes a map of " + std::to_string(map_w) + " x " +
                                       std::to_string(map_h) + " pixels; expected at most 32768 a side");
  int title_w = 0;
  if (!o.title.empty()) {
    const auto lines = lines_of(o.title);
    for (const auto& s : lines) title_w = std::max(title_w, text_width(s));
    g.title_y = pad_;
    g.title_h = line_h * int(lines.size()) + 4;
  }
  int row_w = 0, col_h = 0, col_right = 0;
  if (o.ticks) {
    int widest = 0;
    std::size_t longest = 1;
    if (labelled) {
      for (const auto& s : o.labels) longest = std::max(longest, clip_label(s, 8).size()), widest = std::max(widest, text_width(clip_label(s, 8)));
      col_h = 10 * (int(longest) - 1) + glyph_h;
    } else {
      widest = text_width(std::to_string(L - 1));
      col_h = glyph_h;
    }
    g.step = o.tick_every > 0 ? o.tick_every : nice_step(g.cell, labelled ? line_h : std::max(line_h, widest + 4));
    for (Index i = 0; i < rows; i += g.step) row_w = std::max(row_w, text_width(tick_text(o, i)));
    const Index last = (cols - 1) / g.step * g.step;  // the last labelled column: its text may reach past the map
    const int half = labelled ? 5 : (text_width(std::to_string(last)) + 1) / 2;
    col_right = int(last) * g.cell + g.cell / 2 + half;
  }
  g.map_x = pad_ + (o.ticks ? row_w + tick_gap + tick_len : 0) + frame;
  g.map_y = pad_ + g.title_h + (o.ticks ? col_h + tick_gap + tick_len : 0) + frame;
  int right = std::max(g.map_x + int(map_w) + frame, g.map_x + col_right);
  int bottom = g.map_y + int(map_h) + frame;
  if (o.ticks && rows >= 1) {
    const Index last = (rows - 1) / g.step * g.step;
    bottom = std::max(bottom, g.map_y + int(last) * g.cell + g.cell / 2 - glyph_h / 2 + glyph_h);
  }
  if (o.colorbar) {
    int label_w = text_width("-8.88e-88");
    for (const auto& s : bar_labels) label_w = std::max(label_w, text_width(s));
    g.bar_x = g.map_x + int(map_w) + frame + bar_gap;
    g.bar_y = g.map_y;
    g.bar_w = bar_w;
    g.bar_h = std::max(int(map_h), min_bar_h);
    right = std::max(right, g.bar_x + bar_w + 4 + label_w);
    bottom = std::max(bottom, g.bar_y + g.bar_h + 1);
  }
  g.width = std::max(right + pad_, title_w + 2 * pad_);
  g.height = bottom + pad_;
  return g;
}

inline std::array<std::string, 3> bar_labels(const heatmap_options& o, const display& d) {
  if (!o.colorbar) return {};
  return {format_value(d.value_at(0)), format_value(d.value_at(0.5)), format_value(d.value_at(1))};
}
}  // namespace detail

/// The layout of M's heatmap under o: image size and where the map, title and colorbar lie.
template <class T>
heatmap_layout heatmap_geometry(const Matrix<T>& M, const heatmap_options& o = {}) {
  detail::check_options(M.rows(), M.cols(), o);
  return detail::layout(M.rows(), M.cols(), o, detail::bar_labels(o, detail::resolve(M, o)));
}

/// The heatmap image of a (rows, cols) map: one cell x cell square per entry, coloured as the table
/// at the top of this header says, with the title, ticks and colorbar of the options.
template <class T>
image heatmap_image(const Matrix<T>& M, const heatmap_options& o = {}) {
  explain::detail::require_finite(M, "heatmap", "M");
  iattn::detail::require_shape(M.rows() >= 1 && M.cols() >= 1, "heatmap", "M", M.rows(), M.cols(), "(rows, cols) with rows, cols >= 1");
  detail::check_options(M.rows(), M.cols(), o);
  const detail::display d = detail::resolve(M, o);
  const auto labels = detail::bar_labels(o, d);
  const heatmap_layout g = detail::layout(M.rows(), M.cols(), o, labels);
  const int s = g.cell, map_w = int(M.cols()) * s, map_h = int(M.rows()) * s;
  image img;
  img.width = g.width;
  img.height = g.height;
  img.pixels.assign(std::size_t(img.width) * std::size_t(img.height) * 3, 255);
  const bool framed = g.map_x > 0;
  if (framed) img.fill_rect(g.map_x - 1, g.map_y - 1, g.map_x + map_w + 1, g.map_y + map_h + 1, detail::frame_grey);
  for (Index r = 0; r < M.rows(); ++r)
    for (Index c = 0; c < M.cols(); ++c)
      img.fill_rect(g.map_x + int(c) * s, g.map_y + int(r) * s, g.map_x + int(c + 1) * s, g.map_y + int(r + 1) * s,
                    o.mask_diagonal && r == c ? masked_grey : d.colour(d.position(double(M(r, c)))));
  if (g.title_h > 0) {
    const auto lines = detail::lines_of(o.title);
    for (std::size_t i = 0; i < lines.size(); ++i)
      detail::draw_text(img, (img.width - detail::text_width(lines[i])) / 2, g.title_y + detail::line_h * int(i), lines[i], detail::ink);
  }
  if (o.ticks) {
    const int tick_end = g.map_y - 1 - detail::tick_len;  // column tick marks span [tick_end, map_y - 1)
    for (Index i = 0; i < M.cols(); i += g.step) {
      const int cx = g.map_x + int(i) * s + s / 2;
      img.fill_rect(cx, tick_end, cx + 1, g.map_y - 1, detail::ink);
      const std::string t = detail::tick_text(o, i);
      if (o.labels.empty()) {
        detail::draw_text(img, cx - detail::text_width(t) / 2, tick_end - detail::tick_gap - detail::glyph_h, t, detail::ink);
      } else {  // one glyph per line, the last one next to the tick
        for (std::size_t k = 0; k < t.size(); ++k)
          detail::draw_text(img, cx - 3, tick_end - detail::tick_gap - detail::glyph_h - 10 * int(t.size() - 1 - k), std::string(1, t[k]), detail::ink);
      }
    }
    const int tick_x = g.map_x - 1 - detail::tick_len;  // row tick marks span [tick_x, map_x - 1)
    for (Index i = 0; i < M.rows(); i += g.step) {
      const int cy = g.map_y + int(i) * s + s / 2;
      img.fill_rect(tick_x, cy, g.map_x - 1, cy + 1, detail::ink);
      const std::string t = detail::tick_text(o, i);
      detail::draw_text(img, tick_x - detail::tick_gap - detail::text_width(t), cy - detail::glyph_h / 2, t, detail::ink);
    }
  }
  if (o.colorbar) {
    img.fill_rect(g.bar_x - 1, g.bar_y - 1, g.bar_x + g.bar_w + 1, g.bar_y + g.bar_h + 1, detail::frame_grey);
    for (int y = 0; y < g.bar_h; ++y)  // top row: position 1, bottom row: position 0
      img.fill_rect(g.bar_x, g.bar_y + y, g.bar_x + g.bar_w, g.bar_y + y + 1, d.colour(g.bar_h > 1 ? 1.0 - double(y) / (g.bar_h - 1) : 1.0));
    const int lx = g.bar_x + g.bar_w + 4;
    detail::draw_text(img, lx, g.bar_y, labels[2], detail::ink);
    detail::draw_text(img, lx, g.bar_y + g.bar_h / 2 - detail::glyph_h / 2, labels[1], detail::ink);
    detail::draw_text(img, lx, g.bar_y + g.bar_h - detail::glyph_h, labels[0], detail::ink);
  }
  return img;
}

/// What a heatmap shows, for its title and caption.
struct map_subject {
  std::string model = {};  ///< e.g. "RetNet"; empty: none
  Index channel = -1;      ///< >= 0: one channel's matrix H^c
  Index channels = 0;      ///< > 0 (with channel < 0): the mean over this many channels
  bool abs_mean = false;   ///< with channels: the mean of |H^c| rather than of H^c
  std::string what = {};   ///< otherwise: free text, e.g. "rollout over 4 layers"
};

namespace detail {
inline std::string subject_text(const map_subject& s, bool abs) {
  const std::string N = std::to_string(s.channels);
  std::string t;
  if (s.channel >= 0)
    t = (abs ? "abs(H^c)" : "H^c") + std::string(", channel ") + std::to_string(s.channel);
  else if (s.channels > 0 && s.abs_mean)
    t = "mean of abs(H^c) over " + N + " channels";  // already non-negative: abs changes nothing
  else if (s.channels > 0)
    t = abs ? "abs(mean over " + N + " channels of H^c)" : "mean over " + N + " channels of H^c";
  else
    t = abs ? "abs(" + s.what + ")" : s.what;
  return s.model.empty() ? t : s.model + ": " + t;
}
inline std::string display_text(const display& d) {
  std::string t;
  if (d.scale == scale_kind::log) {
    t = d.normalize ? "log10, " + format_value(-std::log10(d.floor_rel)) + " decades below the max"
                    : "log10 on [" + format_value(d.floor_rel) + ", 1]";
  } else if (d.cmap == colormap_kind::diverging) {
    t = d.normalize ? "signed, linear, diverging on [-max, max]" : "signed, linear, diverging, clamped to [-1, 1]";
  } else {
    t = d.normalize ? "linear min-max" : "linear, clamped to [0, 1]";
  }
  return d.mask ? t + ", diagonal masked" : t;
}
}  // namespace detail

/// A short title: "RetNet: mean over 128 channels of H^c", "Mamba: mean of abs(H^c) over 512 channels".
/// Titles write abs(...) rather than |...|: stb_easy_font's '|' reads as 'l'.
inline std::string heatmap_title(const map_subject& s) { return detail::subject_text(s, false); }

/// What M's heatmap under o shows, in words: the subject (written abs(...) when the display takes the
/// absolute value of a map with negative entries), then `separator`, then the display: the scale,
/// the range, and whether the diagonal is masked. E.g. "RetNet: abs(mean over 128 channels of H^c),
/// linear min-max, diagonal masked" or "Mamba: H^c, channel 170, signed, linear, diverging on
/// [-max, max]". Pass separator "\n" for a two-line image title.
template <class T>
std::string heatmap_caption(const map_subject& s, const Matrix<T>& M, const heatmap_options& o, const std::string& separator = ", ") {
  explain::detail::require_finite(M, "heatmap_caption", "M");
  detail::check_options(M.rows(), M.cols(), o);
  const detail::display d = detail::resolve(M, o);
  return detail::subject_text(s, d.takes_abs() && d.signed_entries) + separator + detail::display_text(d);
}

/// PNG bytes of an image.
inline std::string encode_png(const image& img) {
  std::string out;
  auto sink = [](void* ctx, void* data, int size) { static_cast<std::string*>(ctx)->append(static_cast<const char*>(data), std::size_t(size)); };
  if (!stbi_write_png_to_func(sink, &out, img.width, img.height, 3, img.pixels.data(), img.width * 3))
    iattn::detail::fail("png", "encoding a " + std::to_string(img.width) + "x" + std::to_string(img.height) + " image failed");
  return out;
}

/// Writes M as a heatmap PNG (see heatmap_options and the table at the top of this header). Throws on bad input or an unwritable
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
