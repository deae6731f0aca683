#include "CTributaryExecutorHook.h"

// Declared by the Swift runtime (swift/Runtime/Concurrency.h) as a function pointer; only its address
// is taken here, so it is declared as the pointer-sized slot it is.
extern void *swift_task_enqueueGlobal_hook;

void *_Nullable *_Nonnull tributary_swift_task_enqueue_global_hook(void) {
    return &swift_task_enqueueGlobal_hook;
}
