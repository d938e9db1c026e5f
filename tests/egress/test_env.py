"""proxy_environment: every client family points at the proxy, nothing bypasses it."""

from __future__ import annotations

import pytest

from stockade.egress import proxy_environment


def test_variables() -> None:
    env = proxy_environment("http://127.0.0.1:3128")
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        assert env[key] == "http://127.0.0.1:3128"
    # Never socks5h://: httpx without its SOCKS extra refuses to start with one.
    assert env["ALL_PROXY"] == env["all_proxy"] == "http://127.0.0.1:3128"
    assert env["NO_PROXY"] == env["no_proxy"] == ""
    assert env["NODE_USE_ENV_PROXY"] == "1"
    assert env["npm_config_proxy"] == env["npm_config_https_proxy"] == "http://127.0.0.1:3128"
    assert env["YARN_HTTP_PROXY"] == env["YARN_HTTPS_PROXY"] == "http://127.0.0.1:3128"
    assert env["PIP_PROXY"] == env["CARGO_HTTP_PROXY"] == "http://127.0.0.1:3128"
    assert env["GIT_CONFIG_COUNT"] == "1"
    assert (env["GIT_CONFIG_KEY_0"], env["GIT_CONFIG_VALUE_0"]) == (
        "http.proxy",
        "http://127.0.0.1:3128",
    )
    for key in ("JAVA_TOOL_OPTIONS", "GRADLE_OPTS"):
        flags = env[key].split()
        for flag in (
            "-Dhttp.proxyHost=127.0.0.1",
            "-Dhttp.proxyPort=3128",
            "-Dhttps.proxyHost=127.0.0.1",
            "-Dhttps.proxyPort=3128",
            "-DsocksProxyHost=127.0.0.1",
            "-DsocksProxyPort=3128",
        ):
            assert flag in flags


def test_ipv6_proxy() -> None:
    env = proxy_environment("http://[::1]:8080")
    assert env["HTTP_PROXY"] == "http://[::1]:8080"
    assert env["ALL_PROXY"] == "http://[::1]:8080"
    assert "-Dhttp.proxyHost=::1" in env["JAVA_TOOL_OPTIONS"]


@pytest.mark.parametrize(
    "url",
    ["https://127.0.0.1:1", "http://127.0.0.1", "http://proxy.test:1", "http://u:p@127.0.0.1:1"],
)
def test_bad_urls(url: str) -> None:
    with pytest.raises(ValueError):
        proxy_environment(url)
