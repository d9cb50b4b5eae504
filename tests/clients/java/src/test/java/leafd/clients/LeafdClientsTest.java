package leafd.clients;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import io.lettuce.core.ClientOptions;
import io.lettuce.core.LettuceFutures;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisFuture;
import io.lettuce.core.RedisURI;
import io.lettuce.core.TransactionResult;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.api.async.RedisAsyncCommands;
import io.lettuce.core.api.sync.RedisCommands;
import io.lettuce.core.cluster.api.async.RedisClusterAsyncCommands;
import io.lettuce.core.codec.ByteArrayCodec;
import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.output.IntegerOutput;
import io.lettuce.core.protocol.CommandArgs;
import io.lettuce.core.protocol.ProtocolKeyword;
import io.lettuce.core.protocol.ProtocolVersion;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.redisson.Redisson;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;
import org.springframework.dao.DataAccessException;
import org.springframework.data.redis.connection.RedisStandaloneConfiguration;
import org.springframework.data.redis.connection.jedis.JedisConnectionFactory;
import org.springframework.data.redis.connection.lettuce.LettuceConnectionFactory;
import org.springframework.data.redis.core.RedisCallback;
import org.springframework.data.redis.core.RedisOperations;
import org.springframework.data.redis.core.SessionCallback;
import org.springframework.data.redis.core.StringRedisTemplate;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.JedisPool;
import redis.clients.jedis.JedisPoolConfig;
import redis.clients.jedis.Pipeline;
import redis.clients.jedis.Response;
import redis.clients.jedis.Transaction;
import redis.clients.jedis.commands.ProtocolCommand;

/**
 * leafd through Jedis, Lettuce (RESP3 and RESP2), Redisson and Spring Data Redis, each with a
 * password, pipelines, a transaction and a pool under threads. Every ID from every client is
 * collected; a repeat fails the test that saw it.
 */
class LeafdClientsTest {
  static final String HOST = System.getenv().getOrDefault("LEAFD_HOST", "127.0.0.1");
  static final int PORT = Integer.parseInt(System.getenv().getOrDefault("LEAFD_PORT", "6380"));
  static final String PASSWORD = System.getenv("LEAFD_PASSWORD");
  static final String TAG = "java-" + System.nanoTime();
  static final String KEY = "segment:" + TAG;
  static final Map<Long, String> SEEN = new ConcurrentHashMap<>();

  static void record(String client, long id) {
    assertTrue(id > 0, client + ": non-positive ID " + id);
    String other = SEEN.putIfAbsent(id, client);
    if (other != null) {
      fail(client + ": ID " + id + " was already issued to " + other);
    }
  }

  static long asLong(Object reply) {
    if (reply instanceof Number n) {
      return n.longValue();
    }
    if (reply instanceof byte[] b) {
      return Long.parseLong(new String(b, StandardCharsets.UTF_8));
    }
    throw new AssertionError("not an integer reply: " + reply);
  }

  @BeforeAll
  static void createTag() {
    assertNotNull(PASSWORD, "LEAFD_PASSWORD must be set (tests/clients/run.sh sets it)");
    try (Jedis jedis = new Jedis(HOST, PORT)) {
      jedis.auth(PASSWORD);
      Object reply = jedis.sendCommand(Leaf.TAG, "CREATE", TAG, "100");
      assertEquals("OK", new String((byte[]) reply, StandardCharsets.UTF_8));
    }
  }

  @AfterAll
  static void summary() {
    System.out.println("java clients: " + SEEN.size() + " IDs, all distinct");
  }

  /** leafd's own commands for Jedis' sendCommand. */
  enum Leaf implements ProtocolCommand {
    SNOWFLAKE("SNOWFLAKE"),
    TAG("LEAF.TAG");

    private final byte[] raw;

    Leaf(String name) {
      raw = name.getBytes(StandardCharsets.UTF_8);
    }

    @Override
    public byte[] getRaw() {
      return raw;
    }
  }

  @Test
  void jedis() throws Exception {
    JedisPoolConfig config = new JedisPoolConfig();
    config.setMaxTotal(8);
    try (JedisPool pool = new JedisPool(config, HOST, PORT, 2000, PASSWORD)) {
      try (Jedis jedis = pool.getResource()) {
        record("jedis", jedis.incr(KEY));
        record("jedis", asLong(jedis.sendCommand(Leaf.SNOWFLAKE)));
        record("jedis", jedis.incr("snowflake"));
        Pipeline pipeline = jedis.pipelined();
        List<Response<Long>> replies = new ArrayList<>();
        for (int i = 0; i < 500; i++) {
          replies.add(pipeline.incr(KEY));
        }
        pipeline.sync();
        for (Response<Long> reply : replies) {
          record("jedis pipeline", reply.get());
        }
        Transaction tx = jedis.multi();
        tx.incr(KEY);
        tx.incr(KEY);
        tx.incr("snowflake");
        for (Object reply : tx.exec()) {
          record("jedis multi/exec", asLong(reply));
        }
      }
      threads("jedis pool", () -> {
        try (Jedis jedis = pool.getResource()) {
          record("jedis pool", jedis.incr(KEY));
          record("jedis pool", asLong(jedis.sendCommand(Leaf.SNOWFLAKE)));
        }
      });
    }
  }

  /** SNOWFLAKE for Lettuce's dispatch. */
  enum LettuceLeaf implements ProtocolKeyword {
    SNOWFLAKE;

    @Override
    public byte[] getBytes() {
      return name().getBytes(StandardCharsets.US_ASCII);
    }

    @Override
    public String toString() {
      return name();
    }
  }

  void lettuce(ProtocolVersion protocol) throws Exception {
    String name = "lettuce " + protocol;
    RedisURI uri = RedisURI.builder().withHost(HOST).withPort(PORT)
        .withPassword(PASSWORD.toCharArray()).build();
    RedisClient client = RedisClient.create(uri);
    client.setOptions(ClientOptions.builder().protocolVersion(protocol).build());
    try (StatefulRedisConnection<String, String> connection = client.connect()) {
      RedisCommands<String, String> sync = connection.sync();
      record(name, sync.incr(KEY));
      record(name, sync.dispatch(LettuceLeaf.SNOWFLAKE, new IntegerOutput<>(StringCodec.UTF8)));
      sync.multi();
      sync.incr(KEY);
      sync.incrby(KEY, 10);
      TransactionResult result = sync.exec();
      assertEquals(2, result.size());
      long last = (Long) result.get(1);
      for (long id = last - 9; id <= last; id++) {
        record(name + " multi/exec", id);
      }
      record(name + " multi/exec", (Long) result.get(0));

      RedisAsyncCommands<String, String> async = connection.async();
      connection.setAutoFlushCommands(false);
      List<RedisFuture<Long>> futures = new ArrayList<>();
      for (int i = 0; i < 500; i++) {
        futures.add(async.incr(KEY));
      }
      connection.flushCommands();
      connection.setAutoFlushCommands(true);
      assertTrue(LettuceFutures.awaitAll(Duration.ofSeconds(10), futures.toArray(new RedisFuture[0])));
      for (RedisFuture<Long> future : futures) {
        record(name + " pipeline", future.get());
      }
      // One connection shared by threads, as Lettuce is meant to be used.
      threads(name + " shared connection", () -> {
        record(name + " threads", sync.incr(KEY));
        record(name + " threads",
            sync.dispatch(LettuceLeaf.SNOWFLAKE, new IntegerOutput<>(StringCodec.UTF8),
                new CommandArgs<>(StringCodec.UTF8)));
      });
    } finally {
      client.shutdown();
    }
  }

  @Test
  void lettuceResp3() throws Exception {
    lettuce(ProtocolVersion.RESP3);
  }

  @Test
  void lettuceResp2() throws Exception {
    lettuce(ProtocolVersion.RESP2);
  }

  @Test
  void redisson() throws Exception {
    Config config = new Config();
    config.useSingleServer().setAddress("redis://" + HOST + ":" + PORT).setPassword(PASSWORD)
        .setConnectionPoolSize(8).setConnectionMinimumIdleSize(1);
    RedissonClient redisson = Redisson.create(config);
    try {
      // RAtomicLong is how a Redisson user counts: INCR on the key.
      record("redisson RAtomicLong", redisson.getAtomicLong(KEY).incrementAndGet());
      record("redisson RAtomicLong snowflake", redisson.getAtomicLong("snowflake").incrementAndGet());
      threads("redisson", () -> {
        record("redisson threads", redisson.getAtomicLong(KEY).incrementAndGet());
        record("redisson threads", redisson.getAtomicLong("snowflake").incrementAndGet());
      });
    } finally {
      redisson.shutdown();
    }
  }

  @Test
  void springDataRedis() throws Exception {
    RedisStandaloneConfiguration server = new RedisStandaloneConfiguration(HOST, PORT);
    server.setPassword(PASSWORD);
    LettuceConnectionFactory factory = new LettuceConnectionFactory(server);
    factory.afterPropertiesSet();
    factory.start();
    try {
      StringRedisTemplate template = new StringRedisTemplate(factory);
      template.afterPropertiesSet();
      record("spring increment", template.opsForValue().increment(KEY));
      // Snowflake IDs through the template: INCR snowflake, GET snowflake (a bulk string, as
      // Redis's GET). Spring's raw execute() over Lettuce decodes every reply as bytes and
      // cannot take SNOWFLAKE's integer: use Lettuce's own dispatch (or the Jedis driver, below).
      record("spring increment snowflake", template.opsForValue().increment("snowflake"));
      record("spring get snowflake", Long.parseLong(template.opsForValue().get("snowflake")));
      Object nativeId = template.execute((RedisCallback<Object>) c -> {
        @SuppressWarnings("unchecked")
        RedisClusterAsyncCommands<byte[], byte[]> lettuce =
            (RedisClusterAsyncCommands<byte[], byte[]>) c.getNativeConnection();
        try {
          return lettuce.dispatch(LettuceLeaf.SNOWFLAKE, new IntegerOutput<>(ByteArrayCodec.INSTANCE))
              .get(10, TimeUnit.SECONDS);
        } catch (Exception e) {
          throw new IllegalStateException(e);
        }
      });
      record("spring lettuce dispatch SNOWFLAKE", asLong(nativeId));
      List<Object> piped = template.executePipelined((RedisCallback<Object>) c -> {
        for (int i = 0; i < 200; i++) {
          c.stringCommands().incr(KEY.getBytes(StandardCharsets.UTF_8));
        }
        return null;
      });
      assertEquals(200, piped.size());
      for (Object id : piped) {
        record("spring pipeline", asLong(id));
      }
      List<Object> tx = template.execute(new SessionCallback<List<Object>>() {
        @Override
        @SuppressWarnings({"unchecked", "rawtypes"})
        public List<Object> execute(RedisOperations operations) throws DataAccessException {
          operations.multi();
          operations.opsForValue().increment(KEY);
          operations.opsForValue().increment(KEY);
          return operations.exec();
        }
      });
      assertEquals(2, tx.size());
      for (Object id : tx) {
        record("spring SessionCallback multi/exec", asLong(id));
      }
      threads("spring", () -> record("spring threads", template.opsForValue().increment(KEY)));
    } finally {
      factory.destroy();
    }
  }

  @Test
  void springDataRedisOverJedis() throws Exception {
    RedisStandaloneConfiguration server = new RedisStandaloneConfiguration(HOST, PORT);
    server.setPassword(PASSWORD);
    JedisConnectionFactory factory = new JedisConnectionFactory(server);
    factory.afterPropertiesSet();
    factory.start();
    try {
      StringRedisTemplate template = new StringRedisTemplate(factory);
      template.afterPropertiesSet();
      record("spring/jedis increment", template.opsForValue().increment(KEY));
      // The raw execute a Spring user would write for SNOWFLAKE.
      Object raw = template.execute((RedisCallback<Object>) c -> c.execute("SNOWFLAKE"));
      record("spring/jedis execute SNOWFLAKE", asLong(raw));
      threads("spring/jedis", () -> record("spring/jedis threads",
          asLong(template.execute((RedisCallback<Object>) c -> c.execute("SNOWFLAKE")))));
    } finally {
      factory.destroy();
    }
  }

  /** Runs `body` 200 times on each of 8 threads. */
  static void threads(String name, ThrowingRunnable body) throws Exception {
    ExecutorService pool = Executors.newFixedThreadPool(8);
    try {
      List<Future<?>> futures = new ArrayList<>();
      for (int t = 0; t < 8; t++) {
        futures.add(pool.submit(() -> {
          for (int i = 0; i < 200; i++) {
            body.run();
          }
          return null;
        }));
      }
      for (Future<?> future : futures) {
        future.get(60, TimeUnit.SECONDS);
      }
    } finally {
      pool.shutdownNow();
    }
  }

  interface ThrowingRunnable {
    void run() throws Exception;
  }
}
