// sparsecp._core: the extension module. Errors of the C++ library become the Python
// exceptions the seed raises for them, by kind (include/sparsecp/error.hpp), with the
// message unchanged (it already carries the seed's text where the seed has one):
//   kInvalidInput -> ValueError, kMisuse -> RuntimeError, kTransport -> RuntimeError,
//   kResource -> MemoryError.
#include <nanobind/nanobind.h>

#include "bindings.hpp"
#include "sparsecp/error.hpp"

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
}
