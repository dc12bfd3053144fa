# nginx-conf.sh, sourced by the proxy benchmarks: nginx_conf DIR PORT UPSTREAM_PORT writes
# DIR/nginx.conf, nginx as a reverse proxy users would run in the sidecar's place:
# NGINX_WORKERS workers (1), a keep-alive pool to the upstream, no buffering either way,
# every temporary path in DIR. Start it with: nginx -c DIR/nginx.conf -p DIR
nginx_conf() {
  local dir=$1 port=$2 up=$3
  cat >"$dir/nginx.conf" <<CONF
worker_processes ${NGINX_WORKERS:-1};
pid $dir/nginx.pid;
error_log $dir/nginx-error.log warn;
daemon off;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir/client_body;
  proxy_temp_path $dir/proxy;
  fastcgi_temp_path $dir/fastcgi;
  uwsgi_temp_path $dir/uwsgi;
  scgi_temp_path $dir/scgi;
  client_max_body_size 32m;
  upstream llm { server 127.0.0.1:$up; keepalive 256; }
  server {
    listen 127.0.0.1:$port;
    location / {
      proxy_pass http://llm;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 600s;
    }
  }
}
CONF
}
