/*
 * pause: the first process of a pod sandbox, which only holds the pod's
 * namespaces. It sleeps until a signal arrives, reaps every child that
 * exits (as PID 1 it inherits a pod's orphans when the pod shares its PID
 * namespace), and exits 0 on SIGINT or SIGTERM.
 *
 * Built statically by tests/tools/build.sh (test-images) for the sandbox
 * image the test nodes' containerd uses.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig)
{
    if (sig == SIGINT || sig == SIGTERM)
        stop_signal = sig;
    /* SIGCHLD only wakes the main loop, which reaps. */
}

static void reap(void)
{
    int saved = errno;

    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
    errno = saved;
}

int main(int argc, char **argv)
{
    struct sigaction sa;
    sigset_t wait_mask, block;

    if (argc > 1 && (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0)) {
        puts("carina test pause 1");
        return 0;
    }
    if (getpid() != 1)
        fprintf(stderr, "pause: not PID 1; orphans of other processes are not reaped here\n");

    /* The signals are blocked except inside sigsuspend, so none is lost
     * between checking for it and going to sleep. */
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &block, &wait_mask) != 0) {
        perror("pause: sigprocmask");
        return 1;
    }
    sigdelset(&wait_mask, SIGINT);
    sigdelset(&wait_mask, SIGTERM);
    sigdelset(&wait_mask, SIGCHLD);

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_NOCLDSTOP;
    if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0 ||
        sigaction(SIGCHLD, &sa, NULL) != 0) {
        perror("pause: sigaction");
        return 1;
    }

    while (!stop_signal) {
        sigsuspend(&wait_mask);
        reap();
    }
    fprintf(stderr, "pause: signal %d, exiting\n", (int)stop_signal);
    return 0;
}
