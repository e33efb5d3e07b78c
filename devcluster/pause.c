/* The pod sandbox ("pause") process of the dev cluster's image egpu.local/pause:3.10
 * (devcluster/images.py builds it with gcc -static -Os -s).
 *
 * It holds the pod's namespaces open: it blocks until SIGINT or SIGTERM and then exits 0. As
 * PID 1 of a pod that shares its PID namespace it is the reaper of orphans: on SIGCHLD it
 * waits for every exited child. Only async-signal-safe calls run in the handlers.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define VERSION "3.10-egpu"

static void say(const char *msg) {
  size_t left = strlen(msg);
  while (left > 0) {
    ssize_t n = write(STDERR_FILENO, msg, left);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return;
    msg += n;
    left -= (size_t)n;
  }
}

static void on_stop(int sig) {
  (void)sig;
  say("pause: shutting down, got a stop signal\n");
  _exit(0);
}

static void on_child(int sig) {
  int saved = errno;
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
  errno = saved;
}

static int handle(int sig, void (*fn)(int), int flags) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = fn;
  sa.sa_flags = flags;
  sigemptyset(&sa.sa_mask);
  return sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "-v") == 0 || strcmp(argv[i], "--version") == 0) {
      say("pause " VERSION "\n");
      return 0;
    }
  }
  if (getpid() != 1)
    say("pause: warning: not running as PID 1\n");
  if (handle(SIGINT, on_stop, 0) < 0 || handle(SIGTERM, on_stop, 0) < 0 ||
      handle(SIGCHLD, on_child, SA_NOCLDSTOP | SA_RESTART) < 0) {
    say("pause: sigaction failed\n");
    return 1;
  }
  for (;;)
    pause();
}
