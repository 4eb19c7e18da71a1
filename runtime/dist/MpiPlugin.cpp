//===- MpiPlugin.cpp - libmhcc_mpi.so: MPI for the rank bootstrap --------------===//
//
// The only code that links MPI. mhcrun loads it (dlopen) when mpirun or srun
// started it, so that mhcrun itself runs where MPI is not installed.
//
//===----------------------------------------------------------------------===//
// The C bindings only (Open MPI would pull in its C++ bindings otherwise).
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdio>
#include <cstring>

namespace {

void describe(int code, const char *what, char *error, int errorSize) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  std::snprintf(error, errorSize, "%s failed: %.*s", what, length, text);
}

} // namespace

extern "C" {

/// Broadcasts rank 0's first *size bytes of `buffer` (capacity bytes) to all
/// ranks, initializing MPI on first use; *size is set on every rank.
int mhcc_mpi_broadcast(char *buffer, long capacity, long *size, char *error, int errorSize) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int code = MPI_Init(nullptr, nullptr);
    if (code != MPI_SUCCESS) {
      describe(code, "MPI_Init", error, errorSize);
      return 1;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  int code = MPI_Bcast(size, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  if (code != MPI_SUCCESS) {
    describe(code, "MPI_Bcast (size)", error, errorSize);
    return 1;
  }
  if (*size > capacity) {
    std::snprintf(error, errorSize, "rank 0 broadcasts %ld bytes, more than the %ld expected", *size, capacity);
    return 1;
  }
  code = MPI_Bcast(buffer, static_cast<int>(*size), MPI_BYTE, 0, MPI_COMM_WORLD);
  if (code != MPI_SUCCESS) {
    describe(code, "MPI_Bcast", error, errorSize);
    return 1;
  }
  return 0;
}

void mhcc_mpi_finalize() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized)
    MPI_Finalize();
}

/// Ends every process of the job (MPI_Abort), for a rank that failed:
/// mpirun and srun wait for the others otherwise, which may wait for it in
/// NCCL's initialization or a socket forever. Nothing before MPI_Init.
void mhcc_mpi_abort(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized)
    MPI_Abort(MPI_COMM_WORLD, code);
}

} // extern "C"
