import com.sun.net.httpserver.HttpServer;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.Executors;
import java.util.concurrent.Semaphore;

/**
 * A lock-free HTTP service on virtual threads, for the corpus (JDK 21 and later): the JDK's
 * own HTTP server with a virtual thread per request, each request answered after a fixed piece
 * of CPU work ({@code Corpus.burn}); nothing shared between requests.
 *
 * <p>Two counterfactuals, in a third argument: {@code platform:N} runs the requests on a fixed
 * pool of N platform threads instead; {@code virtual:N} keeps a virtual thread per request but
 * lets at most N of them into the handler at once (a fair {@code Semaphore}), so that the JDK
 * server's monitors under it (the response stream's) are taken by at most N at once and only
 * their sharing changes, not the threads' kind.
 *
 * <pre>java VirtualHttpServer &lt;host:port&gt; &lt;iterations&gt; [platform:N | virtual:N]</pre>
 */
public class VirtualHttpServer {
    static volatile long sink;

    public static void main(String[] args) throws Exception {
        String[] hostPort = args[0].split(":");
        int work = Integer.parseInt(args[1]);
        byte[] body = "ok\n".getBytes(StandardCharsets.US_ASCII);
        HttpServer server = HttpServer.create(
                new InetSocketAddress(hostPort[0], Integer.parseInt(hostPort[1])), 1024);
        String[] threads = (args.length > 2 ? args[2] : "virtual").split(":");
        Semaphore admitted = null;
        switch (threads[0]) {
            case "platform" -> server.setExecutor(
                    Executors.newFixedThreadPool(Integer.parseInt(threads[1])));
            case "virtual" -> {
                server.setExecutor(Executors.newVirtualThreadPerTaskExecutor());
                if (threads.length > 1) {
                    admitted = new Semaphore(Integer.parseInt(threads[1]), true);
                }
            }
            default -> throw new IllegalArgumentException("platform:N or virtual[:N], not " + args[2]);
        }
        Semaphore gate = admitted;
        server.createContext("/", exchange -> {
            if (gate != null) {
                gate.acquireUninterruptibly();
            }
            try {
                sink = Corpus.burn(work, System.nanoTime());
                exchange.getRequestBody().readAllBytes();
                exchange.sendResponseHeaders(200, body.length);
                try (OutputStream out = exchange.getResponseBody()) {
                    out.write(body);
                }
            } finally {
                if (gate != null) {
                    gate.release();
                }
            }
        });
        server.start();
    }
}
