# Command-line clients of the compatibility suite, run inside the sandbox by sh:
# `sh clients.sh JOBS`. Jobs are tab-separated (id, client, method, url, header); one
# `RESULT id status text` line each. curl and wget fetch the URL; pip, uv and npm install
# the tiny package from the index or registry at the URL; git clones the repository at
# the URL (curl-socks: curl through the proxy's SOCKS5). Trust comes from the variables the caller passes (CURL_CA_BUNDLE, PIP_CERT,
# SSL_CERT_FILE, npm_config_cafile, GIT_SSL_CAINFO); wget reads none, so it is handed
# SSL_CERT_FILE's file. $CLIENT_PY is the interpreter with pip, $CLIENT_UV is uv.
tab=$(printf '\t')
mkdir -p out
one_line() { tr '\n\t\r' '   ' | tr -s ' ' | cut -c1-300; }
PKG=stockadetiny
while IFS="$tab" read -r id client method url header; do
    [ -n "$id" ] || continue
    hname=
    hvalue=
    if [ "$header" != "-" ]; then
        hname=${header%%=*}
        hvalue=${header#*=}
        case $hvalue in env:*) eval "hvalue=\${${hvalue#env:}:-}" ;; esac
    fi
    body=out/$id.body
    err=out/$id.err
    : >"$body"
    case $client in
    curl | curl-socks)
        set -- -sS -m 10 -o "$body" -w '%{http_code} %{http_connect}' -X "$method"
        # Told to use SOCKS5 (names resolved by the proxy) on the proxy's listener.
        [ "$client" = curl-socks ] && set -- "$@" --proxy "socks5h://${HTTP_PROXY#http://}"
        [ "$method" = PUT ] && set -- "$@" --data-binary x
        [ -n "$hname" ] && set -- "$@" -H "$hname: $hvalue"
        codes=$(curl "$@" "$url" </dev/null 2>"$err")
        rc=$?
        if [ "${codes% *}" != 000 ]; then
            echo "RESULT $id ${codes% *} $(one_line <"$body")"
        else
            echo "RESULT $id curl-exit-$rc connect=${codes#* } $(one_line <"$err")"
        fi
        ;;
    wget)
        set -- -S -O "$body" --timeout=10 --tries=1 --content-on-error -nv \
            --ca-certificate="$SSL_CERT_FILE" --method="$method"
        [ "$method" = PUT ] && set -- "$@" --body-data=x
        [ -n "$hname" ] && set -- "$@" --header="$hname: $hvalue"
        wget "$@" "$url" </dev/null 2>"$err"
        rc=$?
        code=$(awk '$1 ~ /^HTTP\// { c = $2 } END { print c }' "$err")
        if [ -n "$code" ]; then
            echo "RESULT $id $code $(one_line <"$body")"
        else
            echo "RESULT $id wget-exit-$rc $(grep -v "^ " "$err" | one_line)"
        fi
        ;;
    pip | uv)
        "$CLIENT_PY" -m venv --without-pip "venv-$id" </dev/null >"$err" 2>&1
        if [ "$client" = pip ]; then
            "$CLIENT_PY" -m pip --python "venv-$id/bin/python" install -q \
                --disable-pip-version-check --no-cache-dir --retries 0 --timeout 10 \
                --index-url "$url" "$PKG" </dev/null >>"$err" 2>&1
        else
            "$CLIENT_UV" pip install --python "venv-$id/bin/python" --cache-dir "uv-cache-$id" \
                --index-url "$url" -q "$PKG" </dev/null >>"$err" 2>&1
        fi
        rc=$?
        if [ $rc = 0 ]; then
            echo "RESULT $id ok $("venv-$id/bin/python" -c "import $PKG; print($PKG.MESSAGE)" 2>&1 | one_line)"
        else
            echo "RESULT $id $client-exit-$rc $(tail -n 4 "$err" | one_line)"
        fi
        ;;
    npm)
        mkdir -p "npm-$id" && echo '{}' >"npm-$id/package.json"
        (cd "npm-$id" && npm install --registry "$url" --cache "../npm-cache-$id" --no-audit \
            --no-fund --no-update-notifier --fetch-retries 0 --fetch-timeout 10000 \
            --loglevel error "$PKG") </dev/null >"$err" 2>&1
        rc=$?
        if [ $rc = 0 ]; then
            echo "RESULT $id ok $(cd "npm-$id" && node -e "console.log(require('$PKG'))" 2>&1 | one_line)"
        else
            echo "RESULT $id npm-exit-$rc $(tail -n 4 "$err" | one_line)"
        fi
        ;;
    git)
        GIT_TERMINAL_PROMPT=0 git clone -q "$url" "git-$id" </dev/null >"$err" 2>&1
        rc=$?
        if [ $rc = 0 ]; then
            echo "RESULT $id ok $(one_line <"git-$id/hello.txt")"
        else
            echo "RESULT $id git-exit-$rc $(one_line <"$err")"
        fi
        ;;
    *)
        echo "RESULT $id unknown-client $client"
        ;;
    esac
done <"$1"
