// Go's net/http client of the compatibility suite, built outside the sandbox with
// CGO_ENABLED=0 (so Go's own resolver reads /etc/resolv.conf and asks the name server
// itself) and run inside it: `client JOBS`. Jobs are tab-separated (id, client, method,
// url, header); one `RESULT id status text` line each. http.DefaultClient's transport
// takes proxies from the environment; trust comes from SSL_CERT_FILE.
package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

func oneLine(text string) string {
	s := strings.Join(strings.Fields(text), " ")
	if len(s) > 300 {
		s = s[:300]
	}
	return s
}

func run(method, url, header string) string {
	var body io.Reader
	if method == "PUT" || method == "POST" {
		body = strings.NewReader("x")
	}
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		return "BadRequest " + oneLine(err.Error())
	}
	if header != "-" {
		name, value, _ := strings.Cut(header, "=")
		if strings.HasPrefix(value, "env:") {
			value = os.Getenv(value[4:])
		}
		req.Header.Set(name, value)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return "Error " + oneLine(err.Error())
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, oneLine(string(data)))
}

func main() {
	file, err := os.Open(os.Args[1])
	if err != nil {
		panic(err)
	}
	scanner := bufio.NewScanner(file)
	for scanner.Scan() {
		line := scanner.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		f := strings.Split(line, "\t")
		fmt.Printf("RESULT %s %s\n", f[0], run(f[2], f[3], f[4]))
	}
}
