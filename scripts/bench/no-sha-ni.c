/* A process that believes its CPU has no SHA extensions (SHA-NI), for measuring on a
 * machine that has them the path a CPU without them takes: `LD_PRELOAD` this library.
 *
 * Every SHA-256 in `sous` picks its code from CPUID at run time (RustCrypto's `sha2`
 * through `cpufeatures`, `ring` through its own detection, `std`'s
 * `is_x86_feature_detected!`), and none of them can be told to ignore a feature the CPU
 * has. `SOUS_SHA256=portable` forces RustCrypto's software SHA-256, but a CPU without
 * SHA-NI runs `ring`'s AVX code, which is faster. So this library makes the CPUID
 * instruction fault (Linux's `arch_prctl(ARCH_SET_CPUID, 0)`, where the CPU offers CPUID
 * faulting: `cpuid_fault` in /proc/cpuinfo), and answers each faulting CPUID itself: the
 * real answer, with the SHA bit of leaf 7 (EBX bit 29) cleared. Every other instruction
 * runs on the real CPU at its real speed. No crate does this (it is a test harness for
 * one process, not code of `sous`), hence these lines.
 *
 *   cc -O2 -shared -fPIC -o target/bench/no-sha-ni.so scripts/bench/no-sha-ni.c
 *   LD_PRELOAD=$PWD/target/bench/no-sha-ni.so target/debug/sous pull ...
 *
 * CPUID faulting is set per thread and inherited by the threads a thread starts, and
 * reset by execve, so the constructor below runs before `main` and before any thread.
 * The SIGSEGV handler is installed first: Rust's runtime then leaves it in place (it
 * installs its stack-overflow handler only over the default one), so a real segfault
 * or stack overflow ends the process with the default action, without Rust's message.
 */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static long set_cpuid(unsigned long enabled) {
    return syscall(SYS_arch_prctl, ARCH_SET_CPUID, enabled);
}

static void say(const char *message) {
    ssize_t ignored = write(2, message, strlen(message));
    (void)ignored;
}

static void on_segv(int sig, siginfo_t *info, void *context) {
    (void)sig;
    (void)info;
    ucontext_t *uc = context;
    greg_t *r = uc->uc_mcontext.gregs;
    const uint8_t *ip = (const uint8_t *)r[REG_RIP];
    if (ip[0] != 0x0f || ip[1] != 0xa2) {
        /* Not a CPUID: the default action when the instruction runs again. */
        signal(SIGSEGV, SIG_DFL);
        return;
    }
    uint32_t leaf = (uint32_t)r[REG_RAX], subleaf = (uint32_t)r[REG_RCX];
    uint32_t a, b, c, d;
    set_cpuid(1);
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(leaf), "c"(subleaf));
    set_cpuid(0);
    if (leaf == 7 && subleaf == 0) {
        b &= ~(1u << 29); /* SHA */
    }
    r[REG_RAX] = a;
    r[REG_RBX] = b;
    r[REG_RCX] = c;
    r[REG_RDX] = d;
    r[REG_RIP] += 2;
}

__attribute__((constructor)) static void hide_sha_ni(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_segv;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGSEGV, &action, NULL) != 0 || set_cpuid(0) != 0) {
        say("no-sha-ni: this CPU or kernel offers no CPUID faulting (cpuid_fault); "
            "cannot hide SHA-NI\n");
        _exit(97);
    }
}
