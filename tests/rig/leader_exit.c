/* A client whose main thread exits while a worker thread keeps writing into its mapped file.
 *
 * usage: leader_exit PATH SIZE close|keep
 *   opens PATH (created when missing, sized SIZE), maps it shared, closes the descriptor after mmap ("close", the usual
 *   C idiom) or keeps it ("keep"), starts a worker thread that writes into the mapping every 10 ms, prints
 *   "READY <pid>" and then ends its main thread with pthread_exit: /proc/PID/maps is then empty and /proc/PID/fd bare
 *   while the worker runs, and /proc/PID/task/TID/ shows the worker's view. The worker prints nothing and runs until
 *   the process is killed. Built by the tests with cc (tests/rig/tritonrig.py build_leader_exit).
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned char *region;
static size_t region_size;

static void *worker(void *arg) {
    (void)arg;
    struct timespec pause = {0, 10 * 1000 * 1000};
    for (unsigned long i = 0;; i++) {
        region[i % region_size] = (unsigned char)i;
        nanosleep(&pause, NULL);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4 || (strcmp(argv[3], "close") && strcmp(argv[3], "keep"))) {
        fprintf(stderr, "usage: %s PATH SIZE close|keep\n", argv[0]);
        return 2;
    }
    region_size = strtoul(argv[2], NULL, 10);
    int fd = open(argv[1], O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)region_size) != 0) {
        perror(argv[1]);
        return 1;
    }
    void *map = mmap(NULL, region_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    region = map;
    memset(map, 1, region_size);
    if (!strcmp(argv[3], "close"))
        close(fd);
    pthread_t thread;
    if (pthread_create(&thread, NULL, worker, NULL) != 0) {
        perror("pthread_create");
        return 1;
    }
    printf("READY %d\n", (int)getpid());
    fflush(stdout);
    pthread_exit(NULL);
}
