// A sampling profiler for one thread of a program that has no perf or gdb beside it (the device machine):
// LD_PRELOAD=host_sampler.so LATHE_SAMPLE_OUT=FILE prog ... (writes FILE.<pid>) records the call stack of the thread
// that loaded it (the main thread) every LATHE_SAMPLE_US microseconds of wall time (default 200; waits on the GPU show
// up as the driver's frames), and writes one line per sample at exit: "module+0xoffset" frames, innermost first.
// bench/host_sampler/report.py symbolizes them against the unstripped binary and sums self and inclusive time per
// function.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

enum { kDepth = 40, kMaxSamples = 100000 };
static void* g_frames[kMaxSamples][kDepth];
static int g_depth[kMaxSamples];
static atomic_int g_count;
static pid_t g_tid;
static timer_t g_timer;

static void on_tick(int sig, siginfo_t* info, void* ctx) {
  (void)sig, (void)info, (void)ctx;
  if ((pid_t)syscall(SYS_gettid) != g_tid) return;
  const int i = atomic_fetch_add(&g_count, 1);
  if (i >= kMaxSamples) return;
  g_depth[i] = backtrace(g_frames[i], kDepth);
}

static void dump(void) {
  // FILE.<pid>: a preloaded parent (serve_load) and the server it starts each write their own.
  char path[4096];
  snprintf(path, sizeof path, "%s.%d", getenv("LATHE_SAMPLE_OUT"), (int)getpid());
  timer_delete(g_timer);
  FILE* f = fopen(path, "w");
  if (!f) return;
  int n = atomic_load(&g_count);
  if (n > kMaxSamples) n = kMaxSamples;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < g_depth[i]; ++j) {
      Dl_info d;
      if (dladdr(g_frames[i][j], &d) && d.dli_fname) {
        const char* base = strrchr(d.dli_fname, '/');
        fprintf(f, "%s%s+0x%lx", j ? " " : "", base ? base + 1 : d.dli_fname,
                (unsigned long)((char*)g_frames[i][j] - (char*)d.dli_fbase));
      } else {
        fprintf(f, "%s?+0x%lx", j ? " " : "", (unsigned long)g_frames[i][j]);
      }
    }
    fputc('\n', f);
  }
  fclose(f);
}

// A wall-clock timer (a thread CPU-time clock fires only at the scheduler's tick, 4 ms here, too coarse for a
// 10 ms step) whose signal goes to the calling thread, every LATHE_SAMPLE_US µs; 0 on success.
static int arm_timer(timer_t* out) {
  g_tid = (pid_t)syscall(SYS_gettid);
  struct sigevent ev;
  memset(&ev, 0, sizeof ev);
  ev.sigev_notify = SIGEV_THREAD_ID;
  ev.sigev_signo = SIGPROF;
  ev._sigev_un._tid = g_tid;
  if (timer_create(CLOCK_MONOTONIC, &ev, out) != 0) return -1;
  const char* us = getenv("LATHE_SAMPLE_US");
  const long period = us ? atol(us) : 200;
  struct itimerspec it = {{0, period * 1000}, {0, period * 1000}};
  timer_settime(*out, 0, &it, NULL);
  return 0;
}

// Points the timer at the calling thread (from then on only its stacks are recorded). A program calls it
// through a weak reference where the work to profile runs on another thread: `lathe serve`'s engine loop does.
void lathe_sample_this_thread(void) {
  if (!getenv("LATHE_SAMPLE_OUT")) return;
  timer_t t;
  if (arm_timer(&t) != 0) return;
  timer_delete(g_timer);
  g_timer = t;
}

__attribute__((constructor)) static void start(void) {
  if (!getenv("LATHE_SAMPLE_OUT")) return;
  void* warm[4];
  backtrace(warm, 4);  // loads the unwinder now, not inside the first signal
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_tick;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigaction(SIGPROF, &sa, NULL);
  if (arm_timer(&g_timer) != 0) return;  // the main thread's
  atexit(dump);
}
