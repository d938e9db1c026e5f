// Node clients of the compatibility suite, run inside the sandbox: `node clients.js JOBS`.
// Jobs are tab-separated (id, client, method, url, header); one `RESULT id status text`
// line each. `node-fetch` is the global fetch, `node-get` is http.request/https.request
// (what http.get/https.get call); both with Node's defaults: trust from
// NODE_EXTRA_CA_CERTS, and whatever Node does with proxy variables (Node 20: nothing).
"use strict";
const fs = require("fs");
const http = require("http");
const https = require("https");

const TIMEOUT = 10000;

function headersOf(spec) {
  if (spec === "-") return {};
  const at = spec.indexOf("=");
  let value = spec.slice(at + 1);
  if (value.startsWith("env:")) value = process.env[value.slice(4)] || "";
  return { [spec.slice(0, at)]: value };
}

function oneLine(text) {
  return String(text).split(/\s+/).join(" ").trim().slice(0, 300);
}

function failure(e) {
  const cause = e.cause || {};
  const code = cause.code || e.code || e.name || "Error";
  return `${code} ${oneLine(`${e.message} ${cause.message || ""}`)}`;
}

async function withFetch(method, url, headers) {
  const init = { method, headers, signal: AbortSignal.timeout(TIMEOUT) };
  if (method === "PUT" || method === "POST") init.body = "x";
  const r = await fetch(url, init);
  return `${r.status} ${oneLine(await r.text())}`;
}

function withGet(method, url, headers) {
  const mod = url.startsWith("https:") ? https : http;
  return new Promise((resolve) => {
    const req = mod.request(url, { method, headers, timeout: TIMEOUT }, (res) => {
      let data = "";
      res.setEncoding("utf8");
      res.on("data", (c) => (data += c));
      res.on("end", () => resolve(`${res.statusCode} ${oneLine(data)}`));
      res.on("error", (e) => resolve(failure(e)));
    });
    req.on("timeout", () => req.destroy(new Error("timeout")));
    req.on("error", (e) => resolve(failure(e)));
    if (method === "PUT" || method === "POST") req.write("x");
    req.end();
  });
}

const CLIENTS = { "node-fetch": withFetch, "node-get": withGet };

async function main() {
  const lines = fs.readFileSync(process.argv[2], "utf8").split("\n").filter((l) => l.trim());
  for (const line of lines) {
    const [id, client, method, url, header] = line.split("\t");
    let out;
    try {
      out = await CLIENTS[client](method, url, headersOf(header));
    } catch (e) {
      out = failure(e);
    }
    console.log(`RESULT ${id} ${out}`);
  }
}

main();
