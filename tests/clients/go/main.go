// Checks leafd with the Go Redis clients people use: go-redis v9 (RESP3 handshake and RESP2,
// pipelines, TxPipelined, a pool under goroutines) and rueidis. Every ID from every check is
// collected and must be distinct. Prints one "ok" line per check; exits 1 on the first failure.
//
//	LEAFD_ADDR=127.0.0.1:6380 LEAFD_PASSWORD=secret go run .
package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

var (
	addr     = os.Getenv("LEAFD_ADDR")
	password = os.Getenv("LEAFD_PASSWORD")
	tag      = fmt.Sprintf("go-%d", time.Now().UnixNano())
	mu       sync.Mutex
	seen     = map[int64]string{}
)

// record adds IDs to the global set; a repeat is a failure.
func record(check string, ids ...int64) {
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if id <= 0 {
			fail(check, fmt.Errorf("non-positive ID %d", id))
		}
		if other, dup := seen[id]; dup {
			fail(check, fmt.Errorf("ID %d also issued in %s", id, other))
		}
		seen[id] = check
	}
}

func fail(check string, err error) {
	fmt.Printf("FAIL %s: %v\n", check, err)
	os.Exit(1)
}

func must(check string, err error) {
	if err != nil {
		fail(check, err)
	}
}

func goRedis(protocol int) {
	check := fmt.Sprintf("go-redis v9 RESP%d", protocol)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr, Password: password, Protocol: protocol, PoolSize: 8})
	defer rdb.Close()
	key := "segment:" + tag

	id, err := rdb.Incr(ctx, key).Result()
	must(check+" INCR", err)
	record(check, id)
	sf, err := rdb.Do(ctx, "SNOWFLAKE").Int64()
	must(check+" SNOWFLAKE", err)
	record(check, sf)
	batch, err := rdb.Do(ctx, "SNOWFLAKE", 100).Int64Slice()
	must(check+" SNOWFLAKE 100", err)
	record(check, batch...)

	// A plain pipeline and a transaction (MULTI/EXEC), go-redis's TxPipelined.
	cmds, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := 0; i < 100; i++ {
			p.Incr(ctx, key)
		}
		return nil
	})
	must(check+" Pipelined", err)
	for _, c := range cmds {
		record(check, c.(*redis.IntCmd).Val())
	}
	cmds, err = rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Incr(ctx, key)
		p.IncrBy(ctx, key, 10)
		p.Do(ctx, "SNOWFLAKE")
		return nil
	})
	must(check+" TxPipelined", err)
	first := cmds[0].(*redis.IntCmd).Val()
	last := cmds[1].(*redis.IntCmd).Val()
	if last-first < 10 {
		fail(check+" TxPipelined", fmt.Errorf("INCRBY 10 block %d overlaps INCR %d", last, first))
	}
	block := []int64{first}
	for i := last - 9; i <= last; i++ {
		block = append(block, i)
	}
	record(check, block...)
	sfTx, err := cmds[2].(*redis.Cmd).Int64()
	must(check+" TxPipelined SNOWFLAKE", err)
	record(check, sfTx)

	// The pool under 16 goroutines.
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				id, err := rdb.Incr(ctx, key).Result()
				must(check+" pool", err)
				record(check, id)
			}
		}()
	}
	wg.Wait()
	fmt.Printf("ok   %s: INCR, SNOWFLAKE [n], pipeline, TxPipelined, pool of 16 goroutines\n", check)
}

func rueidisClient() {
	check := "rueidis"
	ctx := context.Background()
	opt := rueidis.ClientOption{InitAddress: []string{addr}, Password: password}
	client, err := rueidis.NewClient(opt)
	if err != nil && strings.Contains(err.Error(), "TRACKING") {
		fail(check, fmt.Errorf("default options refused: %v", err))
	}
	must(check+" connect", err)
	defer client.Close()
	key := "segment:" + tag
	id, err := client.Do(ctx, client.B().Incr().Key(key).Build()).AsInt64()
	must(check+" INCR", err)
	record(check, id)
	sf, err := client.Do(ctx, client.B().Arbitrary("SNOWFLAKE").Build()).AsInt64()
	must(check+" SNOWFLAKE", err)
	record(check, sf)
	// DoMulti pipelines; rueidis auto-pipelines concurrent Do calls too.
	cmds := make(rueidis.Commands, 0, 100)
	for i := 0; i < 100; i++ {
		cmds = append(cmds, client.B().Incr().Key(key).Build())
	}
	for _, resp := range client.DoMulti(ctx, cmds...) {
		id, err := resp.AsInt64()
		must(check+" DoMulti", err)
		record(check, id)
	}
	// Client-side caching of an ID would repeat it: DoCache must fail, never return a cached ID.
	if _, err := client.DoCache(ctx, client.B().Get().Key("snowflake").Cache(), time.Minute).AsInt64(); err == nil {
		fail(check+" DoCache", fmt.Errorf("DoCache(GET snowflake) succeeded: an ID could be served from a cache"))
	}
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				id, err := client.Do(ctx, client.B().Arbitrary("SNOWFLAKE").Build()).AsInt64()
				must(check+" auto-pipelined SNOWFLAKE", err)
				record(check, id)
			}
		}()
	}
	wg.Wait()
	fmt.Printf("ok   %s: default options (RESP3, CLIENT TRACKING ON OPTIN), INCR, SNOWFLAKE, DoMulti, DoCache refused, 16 goroutines auto-pipelined\n", check)
}

func main() {
	if addr == "" {
		fail("setup", fmt.Errorf("LEAFD_ADDR is not set"))
	}
	admin := redis.NewClient(&redis.Options{Addr: addr, Password: password})
	must("LEAF.TAG CREATE", admin.Do(context.Background(), "LEAF.TAG", "CREATE", tag, 100).Err())
	admin.Close()
	goRedis(3)
	goRedis(2)
	rueidisClient()
	fmt.Printf("ok   go clients: %d IDs, all distinct\n", len(seen))
}
