"""TCP between GPUs, run inside their namespaces by tests/integration/test_adaptive.py.

    python tcp_pairs.py serve PORT                  # until killed: read each connection to
                                                    # its end, answer with the byte count
    python tcp_pairs.py connect PORT BYTES IP ...   # to every IP at once: send BYTES, close
                                                    # the sending side, check the answer;
                                                    # prints the IPs that failed (JSON list)

ICMP reachability (the emulation's readiness probe) does not cover what the adaptive policy
changes: only TCP connections are copied to the controller and steered per connection.
"""

from __future__ import annotations

import json
import socket
import sys
import threading

TIMEOUT = 10.0


def serve(port: int) -> None:
    listener = socket.create_server(("0.0.0.0", port), backlog=128)

    def handle(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(TIMEOUT)
            total = 0
            while chunk := conn.recv(1 << 16):
                total += len(chunk)
            conn.sendall(str(total).encode())

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def connect(port: int, nbytes: int, targets: list[str]) -> list[str]:
    failed: list[str] = []
    lock = threading.Lock()

    def one(ip: str) -> None:
        try:
            with socket.create_connection((ip, port), timeout=TIMEOUT) as conn:
                conn.sendall(b"\xa5" * nbytes)
                conn.shutdown(socket.SHUT_WR)
                answer = b""
                while chunk := conn.recv(64):
                    answer += chunk
            if answer != str(nbytes).encode():
                raise OSError(f"answer {answer!r}")
        except OSError:
            with lock:
                failed.append(ip)

    threads = [threading.Thread(target=one, args=(ip,)) for ip in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(failed)


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        serve(int(argv[1]))
        return 0
    if argv[:1] == ["connect"]:
        print(json.dumps(connect(int(argv[1]), int(argv[2]), argv[3:])))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
