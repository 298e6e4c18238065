// The version the binaries report (the trainstep_build_info metric): the project's version
// from CMakeLists.txt, or "dev" when built without it.
#ifndef TRAINSTEP_COMMON_VERSION_H_
#define TRAINSTEP_COMMON_VERSION_H_

namespace trainstep {

const char* TrainstepVersion();

}  // namespace trainstep

#endif  // TRAINSTEP_COMMON_VERSION_H_
