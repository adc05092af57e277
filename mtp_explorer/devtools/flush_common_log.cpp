// Preloaded into llama.cpp's example programs (LD_PRELOAD) by the reference harness: at exit, wait for the
// printing thread of llama.cpp's common logger to print what it still holds. The logger is leaked on purpose
// (common/log.cpp's common_log_main), so on a loaded machine a program's last lines (its generated text, its
// summary) are lost when the program exits before that thread ran; common_log_pause queues the end and joins it.
// Built by the Makefile beside llama-speculative-simple, linked to its libllama-common (so unloaded after it).

struct common_log;
common_log * common_log_main();
void common_log_pause(common_log * log);

__attribute__((destructor)) static void flush_common_log() {
    common_log_pause(common_log_main());
}
