#include "common/version.h"

// Set by common/CMakeLists.txt for this file's target only.
#ifndef TRAINSTEP_VERSION
#define TRAINSTEP_VERSION "dev"
#endif

namespace trainstep {

const char* TrainstepVersion() { return TRAINSTEP_VERSION; }

}  // namespace trainstep
