# scd2sink: a static binary in a small image, run as an unprivileged user.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/scd2sink ./cmd/scd2sink

FROM alpine:3.20
RUN adduser -D -H -u 10001 scd2sink
COPY --from=build /out/scd2sink /usr/local/bin/scd2sink
USER 10001:10001
EXPOSE 9464
# /healthz: up while the process runs (busybox wget). Readiness (Kafka and
# PostgreSQL reachable, group joined) is /readyz, which docker-compose.yml
# probes to order its services.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s CMD wget -qO- http://127.0.0.1:9464/healthz >/dev/null || exit 1
ENTRYPOINT ["/usr/local/bin/scd2sink"]
CMD ["run", "--config", "/etc/scd2sink/scd2sink.yaml"]
