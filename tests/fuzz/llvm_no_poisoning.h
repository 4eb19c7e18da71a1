// Force-included (-include) into the MLIR fuzz targets' objects. LLVM's
// headers poison the unused tail of each BumpPtrAllocator slab when they are
// compiled under ASan, and unpoison what they hand out. Debian's libMLIR and
// libLLVM are not instrumented: their copies of the same allocator hand out
// memory from slabs our instrumented copies poisoned, and ASan then reports
// a use-after-poison inside MLIR's own code (seen: StringAttr::get writing
// into a slab a ModelConfigAttr allocation had poisoned). Turning the
// poisoning off in our copies keeps every other ASan check.
#include <sanitizer/asan_interface.h>
#define __asan_poison_memory_region(addr, size) ((void)(addr), (void)(size))
#define __asan_unpoison_memory_region(addr, size) ((void)(addr), (void)(size))
