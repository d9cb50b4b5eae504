# Helpers sourced by the bench scripts (loopback only).

# A free TCP port on 127.0.0.1.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Waits until a server answers PING on 127.0.0.1:PORT (PING_TRIES tries 0.1 s apart, default 100);
# extra arguments go to redis-cli (e.g. --tls --cacert FILE). Callers see a server that never
# came up at their first command.
wait_for_ping() {
  local port=$1; shift
  for _ in $(seq 1 "${PING_TRIES:-100}"); do
    redis-cli "$@" -p "$port" PING >/dev/null 2>&1 && return 0
    sleep 0.1
  done
}

# A throw-away self-signed certificate for localhost/127.0.0.1: DIR/cert.pem and DIR/key.pem.
self_signed_cert() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
    -keyout "$1/key.pem" -out "$1/cert.pem" 2>/dev/null
}

# leafd's [tls] section for a RESP-over-TLS listener on 127.0.0.1:PORT with DIR's certificate.
tls_section() {
  printf '[tls]\nbind = "127.0.0.1:%s"\ncert_file = "%s"\nkey_file = "%s"\n' "$1" "$2/cert.pem" "$2/key.pem"
}
