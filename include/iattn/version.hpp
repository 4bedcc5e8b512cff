// iattn/version.hpp
#pragma once

#define IATTN_VERSION_MAJOR 0
#define IATTN_VERSION_MINOR 1
#define IATTN_VERSION_PATCH 0

namespace iattn {
inline constexpr const char* version = "0.1.0";
}
