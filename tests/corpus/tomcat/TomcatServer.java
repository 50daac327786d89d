// The corpus's servlet container: an embedded Apache Tomcat whose one servlet does a fixed
// piece of CPU work a request and answers "ok". Its connector's pool has `threads` workers
// (Tomcat's default is 200; the counterfactual gives it as many as the CPUs).
//
//   java -cp <tomcat jars>:<its classes>:<Corpus classes> TomcatServer <host:port> <threads> <iterations>
//
// Loaded from outside its cgroup by tests/corpus/httpload; its work is the requests answered.
// The work is the corpus's own (`Corpus.burn`, tests/corpus/Corpus.java, on the classpath).

import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.nio.file.Files;
import org.apache.catalina.Context;
import org.apache.catalina.connector.Connector;
import org.apache.catalina.startup.Tomcat;

public class TomcatServer {
    static volatile long sink;

    public static void main(String[] args) throws Exception {
        String[] hostPort = args[0].split(":");
        int threads = Integer.parseInt(args[1]);
        int iterations = Integer.parseInt(args[2]);
        Tomcat tomcat = new Tomcat();
        tomcat.setBaseDir(Files.createTempDirectory("sw-tomcat").toString());
        Connector connector = new Connector();
        connector.setProperty("address", hostPort[0]);
        connector.setPort(Integer.parseInt(hostPort[1]));
        connector.setProperty("maxThreads", Integer.toString(threads));
        connector.setProperty("minSpareThreads", Integer.toString(threads));
        connector.setProperty("maxKeepAliveRequests", "-1");
        tomcat.setConnector(connector);
        Context ctx = tomcat.addContext("", null);
        Tomcat.addServlet(ctx, "work", new HttpServlet() {
            @Override
            protected void doGet(HttpServletRequest req, HttpServletResponse resp)
                    throws IOException {
                sink += Corpus.burn(iterations, System.nanoTime());
                resp.setContentType("text/plain");
                resp.getWriter().write("ok\n");
            }
        });
        ctx.addServletMappingDecoded("/*", "work");
        tomcat.start();
        tomcat.getServer().await();
    }
}
