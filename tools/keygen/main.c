/* tandem-keygen: writes a ZeroMQ CURVE key pair for the coordinator's client
 * endpoint or for a client.
 *
 *   tandem-keygen PREFIX
 *
 * Creates PREFIX.key (the secret key, mode 0600, created exclusively: an
 * existing file is never overwritten) and PREFIX.pub (the public key, 0644),
 * each one Z85 line. The coordinator takes the .key as
 * coordinator.curve_secret_key_file; its clients get the .pub
 * (tandem-client --curve-server-key). A client's .pub goes into the
 * coordinator's coordinator.curve_client_keys_file.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

static int write_key(const char *path, const char *key, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode);
    if (fd < 0) {
        fprintf(stderr, "tandem-keygen: %s: %s\n", path, strerror(errno));
        return -1;
    }
    char line[64];
    int n = snprintf(line, sizeof line, "%s\n", key);
    int ok = write(fd, line, (size_t)n) == n;
    if (close(fd) != 0)
        ok = 0;
    if (!ok) {
        fprintf(stderr, "tandem-keygen: %s: write failed: %s\n", path, strerror(errno));
        unlink(path);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: tandem-keygen PREFIX   (writes PREFIX.key, 0600, and PREFIX.pub)\n");
        return 2;
    }
    char pub[41], sec[41];
    if (zmq_curve_keypair(pub, sec) != 0) {
        fprintf(stderr, "tandem-keygen: zmq_curve_keypair: %s (libzmq without CURVE?)\n",
                zmq_strerror(zmq_errno()));
        return 1;
    }
    char key_path[4096], pub_path[4096];
    if (snprintf(key_path, sizeof key_path, "%s.key", argv[1]) >= (int)sizeof key_path ||
        snprintf(pub_path, sizeof pub_path, "%s.pub", argv[1]) >= (int)sizeof pub_path) {
        fprintf(stderr, "tandem-keygen: PREFIX too long\n");
        return 2;
    }
    if (write_key(key_path, sec, 0600) != 0)
        return 1;
    memset(sec, 0, sizeof sec);
    if (write_key(pub_path, pub, 0644) != 0) {
        unlink(key_path);
        return 1;
    }
    printf("%s\n", pub);
    return 0;
}
