/*
 * The lab's sandbox ("pause") image program: PID 1 of every pod sandbox. It holds the pod's
 * namespaces open, reaps any child re-parented to it, and exits 0 on SIGTERM or SIGINT, so that
 * deleting a sandbox never waits for the kill timeout. Built with `gcc -static`
 * (scripts/build-images.sh), so the image is this one file.
 */
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void)
{
	sigset_t wanted;
	int signal_number;

	sigemptyset(&wanted);
	sigaddset(&wanted, SIGTERM);
	sigaddset(&wanted, SIGINT);
	sigaddset(&wanted, SIGCHLD);
	/* Blocked signals stay pending for sigwait instead of running default actions. */
	sigprocmask(SIG_BLOCK, &wanted, NULL);
	for (;;) {
		if (sigwait(&wanted, &signal_number) != 0)
			return 1;
		if (signal_number == SIGCHLD) {
			while (waitpid(-1, NULL, WNOHANG) > 0)
				;
			continue;
		}
		return 0;
	}
}
