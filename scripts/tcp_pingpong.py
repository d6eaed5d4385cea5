"""TCP round trips of fixed-size messages between two hosts (scripts/netns_split.sh).

server HOST SIZE: echoes SIZE-byte messages on HOST:50070 until one starts with a zero byte.
client HOST SIZE: 2000 round trips to the server, prints the median and p90 in microseconds.
"""

import socket
import sys
import time

PORT = 50070
ROUNDS = 2000


def recv_exactly(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return data


def main():
    role, host, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if role == "server":
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((host, PORT))
        server.listen(1)
        print("up", flush=True)
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            message = recv_exactly(conn, size)
            if message[0] == 0:
                return
            conn.sendall(message)
    conn = socket.create_connection((host, PORT))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    message = b"\1" * size
    times = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        conn.sendall(message)
        recv_exactly(conn, size)
        times.append(time.perf_counter() - start)
    conn.sendall(b"\0" * size)
    times.sort()
    print(f"{size} B each way: median {times[len(times) // 2] * 1e6:.0f} us, "
          f"p90 {times[len(times) * 9 // 10] * 1e6:.0f} us")


if __name__ == "__main__":
    main()
