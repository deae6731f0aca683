#ifndef C_TRIBUTARY_EXECUTOR_HOOK_H
#define C_TRIBUTARY_EXECUTOR_HOOK_H

/// The address of the Swift concurrency runtime's `swift_task_enqueueGlobal_hook`: where a process
/// says which function takes the jobs of Swift's global executor.
///
/// Linked by name, not looked up with `dlsym`: a binary built with `--static-swift-stdlib` (every
/// release build of Tributary) holds the runtime inside, with this variable hidden from its dynamic
/// symbol table, where `dlsym` (and so SwiftNIO's
/// `unsafeTryInstallSingletonPosixEventLoopGroupAsConcurrencyGlobalExecutor()`) cannot find it.
void *_Nullable *_Nonnull tributary_swift_task_enqueue_global_hook(void);

#endif
