// iattn/explain/colormap.hpp: the colormaps of the heatmaps, each a function [0, 1] -> 8-bit RGB.
//
//   viridis(v)    sequential (perceptually uniform, colour-blind friendly), for |M| and log10 |M|
//   diverging(v)  blue - white - red, white at v = 0.5, for signed maps on a symmetric range [-a, a]
//
// viridis: 33 control points of matplotlib's viridis table (entries 0, 8, ..., 248 and 255 of its 256; the
// mpl-colormaps by Nathaniel J. Smith, Stefan van der Walt and Eric Firing, CC0) with linear
// interpolation in between; every 8-bit colour is within 1 of matplotlib's.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

namespace iattn::explain {

using rgb = std::array<std::uint8_t, 3>;

namespace detail {
struct viridis_stop {
  double pos, r, g, b;
};
inline constexpr viridis_stop viridis_stops[] = {
    {0, 0.267004, 0.004874, 0.329415},   {8, 0.277018, 0.050344, 0.375715},   {16, 0.282327, 0.094955, 0.417331},
    {24, 0.282884, 0.135920, 0.453427},  {32, 0.278826, 0.175490, 0.483397},  {40, 0.270595, 0.214069, 0.507052},
    {48, 0.258965, 0.251537, 0.524736},  {56, 0.244972, 0.287675, 0.537260},  {64, 0.229739, 0.322361, 0.545706},
    {72, 0.214298, 0.355619, 0.551184},  {80, 0.199430, 0.387607, 0.554642},  {88, 0.185556, 0.418570, 0.556753},
    {96, 0.172719, 0.448791, 0.557885},  {104, 0.160665, 0.478540, 0.558115}, {112, 0.149039, 0.508051, 0.557250},
    {120, 0.137770, 0.537492, 0.554906}, {128, 0.127568, 0.566949, 0.550556}, {136, 0.120565, 0.596422, 0.543611},
    {144, 0.120638, 0.625828, 0.533488}, {152, 0.132268, 0.655014, 0.519661}, {160, 0.157851, 0.683765, 0.501686},
    {168, 0.196571, 0.711827, 0.479221}, {176, 0.246070, 0.738910, 0.452024}, {184, 0.304148, 0.764704, 0.419943},
    {192, 0.369214, 0.788888, 0.382914}, {200, 0.440137, 0.811138, 0.340967}, {208, 0.515992, 0.831158, 0.294279},
    {216, 0.595839, 0.848717, 0.243329}, {224, 0.678489, 0.863742, 0.189503}, {232, 0.762373, 0.876424, 0.137064},
    {240, 0.845561, 0.887322, 0.099702}, {248, 0.926106, 0.897330, 0.104071}, {255, 0.993248, 0.906157, 0.143936},
};
inline std::uint8_t to_byte(double v) { return static_cast<std::uint8_t>(std::clamp(std::lround(v * 255.0), 0L, 255L)); }
}  // namespace detail

/// The viridis colour of v in [0, 1] (clamped; NaN maps to 0).
inline rgb viridis(double v) {
  if (!(v > 0)) v = 0;
  if (v > 1) v = 1;
  const double p = v * 255.0;
  const auto& s = detail::viridis_stops;
  std::size_t i = std::min<std::size_t>(static_cast<std::size_t>(p / 8.0), std::size(s) - 2);
  const double f = (p - s[i].pos) / (s[i + 1].pos - s[i].pos);
  return {detail::to_byte(s[i].r + f * (s[i + 1].r - s[i].r)), detail::to_byte(s[i].g + f * (s[i + 1].g - s[i].g)),
          detail::to_byte(s[i].b + f * (s[i + 1].b - s[i].b))};
}

namespace detail {
/// Our blue-white-red table: nine anchors at v = k/8, linear interpolation in between. The blue half
/// is the red half with red and blue swapped (anchor 8 - k is anchor k reversed), so equal distances
/// from 0.5 give mirrored colours of equal channel sum; the lightness falls monotonically from the
/// near-white centre (247) to dark navy and dark red ends.
inline constexpr std::uint8_t diverging_stops[9][3] = {
    {30, 10, 120},    // 0/8: dark navy (most negative)
    {50, 50, 182},    // 1/8
    {95, 120, 222},   // 2/8
    {160, 190, 244},  // 3/8
    {247, 247, 247},  // 4/8: zero, off-white so that it stays visible on a white page
    {244, 190, 160},  // 5/8
    {222, 120, 95},   // 6/8
    {182, 50, 50},    // 7/8
    {120, 10, 30},    // 8/8: dark red (most positive)
};
}  // namespace detail

/// The blue-white-red colour of v in [0, 1] (clamped; NaN maps to 0.5, the white centre). A signed
/// value m on [-a, a] is drawn at v = 0.5 + m / (2a).
inline rgb diverging(double v) {
  if (!(v == v)) v = 0.5;
  v = std::clamp(v, 0.0, 1.0);
  const double p = v * 8.0;
  const std::size_t i = std::min<std::size_t>(static_cast<std::size_t>(p), 7);
  const double f = p - double(i);
  const auto& a = detail::diverging_stops[i];
  const auto& b = detail::diverging_stops[i + 1];
  rgb out{};
  for (int k = 0; k < 3; ++k) out[std::size_t(k)] = detail::to_byte((a[k] + f * (double(b[k]) - double(a[k]))) / 255.0);
  return out;
}

}  // namespace iattn::explain
