// Java 17's java.net.http.HttpClient, run inside the sandbox as a single-file program:
// `java Client.java JOBS`. Jobs are tab-separated (id, client, method, url, header); one
// `RESULT id status text` line each. Java has no trust-store variable, so the client
// trusts the certificates of the PEM file that SSL_CERT_FILE names; proxies come from
// the system properties (JAVA_TOOL_OPTIONS) through the default proxy selector.
import java.io.FileInputStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.time.Duration;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

public class Client {
    static String oneLine(String text) {
        String s = String.join(" ", text.trim().split("\\s+"));
        return s.length() > 300 ? s.substring(0, 300) : s;
    }

    static SSLContext trust(String pem) throws Exception {
        KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
        store.load(null, null);
        int n = 0;
        try (FileInputStream in = new FileInputStream(pem)) {
            for (Certificate cert : CertificateFactory.getInstance("X.509").generateCertificates(in)) {
                store.setCertificateEntry("ca" + n++, cert);
            }
        }
        TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        tmf.init(store);
        SSLContext ctx = SSLContext.getInstance("TLS");
        ctx.init(null, tmf.getTrustManagers(), null);
        return ctx;
    }

    public static void main(String[] args) throws Exception {
        HttpClient client = HttpClient.newBuilder()
            .sslContext(trust(System.getenv("SSL_CERT_FILE")))
            .connectTimeout(Duration.ofSeconds(10))
            .version(HttpClient.Version.HTTP_1_1)
            .build();
        for (String line : Files.readAllLines(Path.of(args[0]))) {
            if (line.isBlank()) continue;
            String[] f = line.split("\t");
            String out;
            try {
                HttpRequest.BodyPublisher body = f[2].equals("PUT") || f[2].equals("POST")
                    ? HttpRequest.BodyPublishers.ofString("x")
                    : HttpRequest.BodyPublishers.noBody();
                HttpRequest.Builder req = HttpRequest.newBuilder(URI.create(f[3]))
                    .timeout(Duration.ofSeconds(10))
                    .method(f[2], body);
                if (!f[4].equals("-")) {
                    int at = f[4].indexOf('=');
                    String value = f[4].substring(at + 1);
                    if (value.startsWith("env:")) value = System.getenv(value.substring(4));
                    req.header(f[4].substring(0, at), value);
                }
                HttpResponse<String> r = client.send(req.build(), HttpResponse.BodyHandlers.ofString());
                out = r.statusCode() + " " + oneLine(r.body());
            } catch (Exception e) {
                Throwable cause = e.getCause() == null ? e : e.getCause();
                out = e.getClass().getSimpleName() + " " + oneLine(e + " <- " + cause);
            }
            System.out.println("RESULT " + f[0] + " " + out);
        }
    }
}
