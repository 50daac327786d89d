import com.sun.net.httpserver.HttpServer;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.Executors;

/**
 * A lock-free HTTP service on virtual threads, for the corpus (JDK 21 and later): the JDK's
 * own HTTP server with a virtual thread per request, each request answered after a fixed piece
 * of CPU work ({@code Corpus.burn}); nothing shared between requests.
 *
 * <p>With a third argument N the requests run on a fixed pool of N platform threads instead:
 * the counterfactual of the virtual threads (with 2, the JDK server's own monitors are taken by
 * at most two threads at once).
 *
 * <pre>java VirtualHttpServer &lt;host:port&gt; &lt;iterations&gt; [platform threads]</pre>
 */
public class VirtualHttpServer {
    static volatile long sink;

    public static void main(String[] args) throws Exception {
        String[] hostPort = args[0].split(":");
        int work = Integer.parseInt(args[1]);
        byte[] body = "ok\n".getBytes(StandardCharsets.US_ASCII);
        HttpServer server = HttpServer.create(
                new InetSocketAddress(hostPort[0], Integer.parseInt(hostPort[1])), 1024);
        server.setExecutor(args.length > 2
                ? Executors.newFixedThreadPool(Integer.parseInt(args[2]))
                : Executors.newVirtualThreadPerTaskExecutor());
        server.createContext("/", exchange -> {
            sink = Corpus.burn(work, System.nanoTime());
            exchange.getRequestBody().readAllBytes();
            exchange.sendResponseHeaders(200, body.length);
            try (OutputStream out = exchange.getResponseBody()) {
                out.write(body);
            }
        });
        server.start();
    }
}
