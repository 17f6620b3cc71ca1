// sparsecp._core: the extension module. Errors of the C++ library become the Python
// exceptions the seed raises for them, by kind (include/sparsecp/error.hpp), with the
// message unchanged (it already carries the seed's text where the seed has one):
//   kInvalidInput -> ValueError, kMisuse -> RuntimeError, kTransport -> RuntimeError,
//   kResource -> MemoryError.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "bindings.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/kernels/blas_core.hpp"

namespace nb = nanobind;

NB_MODULE(_core, m) {
  m.doc() =
      "sparsecp's C++ core: planning, routes, agreement fingerprints and CPU kernels. "
      "Use the packages `sparsecp` (planning, no torch needed) and `sparsecp.torch`.";
  nb::register_exception_translator([](const std::exception_ptr& pointer, void*) {
    try {
      std::rethrow_exception(pointer);
    } catch (const sparsecp::Error& error) {
      PyObject* type = PyExc_ValueError;
      switch (error.kind()) {
        case sparsecp::ErrorKind::kInvalidInput:
          type = PyExc_ValueError;
          break;
        case sparsecp::ErrorKind::kMisuse:
        case sparsecp::ErrorKind::kTransport:
          type = PyExc_RuntimeError;
          break;
        case sparsecp::ErrorKind::kResource:
          type = PyExc_MemoryError;
          break;
      }
      PyErr_SetString(type, error.what());
    }
  });
  sparsecp::python::bind_planning(m);
  sparsecp::python::bind_transport(m);
  sparsecp::python::bind_kernels(m);
  sparsecp::python::bind_indexer_kl(m);
  sparsecp::python::bind_attention(m);
  // OpenBLAS fell back to its SSE3 kernels on a CPU newer than it knows: onto the CPU's own
  // family now, before any sparsecp call reaches it (blas_core.hpp; SPARSECP_BLAS_AS_IS=1 or a
  // user's OPENBLAS_CORETYPE leaves it alone).
  sparsecp::use_cpu_blas_core();
  m.def(
      "blas_core", [] { return sparsecp::blas_core_name(); },
      "The OpenBLAS kernel family sparsecp's BLAS calls run ('SkylakeX', 'Haswell', ...).");
}
