// iattn/ops/identity.hpp: the identity matrix I, for any L, D and scalar type.   Causal: yes.
#pragma once

#include "../core/traits.hpp"

namespace iattn {

class Identity : public op_base {
 public:
  using scalar = void;
  Index length() const { return any; }
  Index channels() const { return any; }
};

template <>
inline constexpr bool is_lower_v<Identity> = true;
template <>
inline constexpr bool is_upper_v<Identity> = true;

inline Identity identity() { return {}; }

}  // namespace iattn
