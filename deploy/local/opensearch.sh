#!/usr/bin/env bash
# Real OpenSearch + k-NN plugin on 127.0.0.1 (one node, or a cluster of a few), assembled only from Maven
# Central artifacts.
#
# Usage: opensearch.sh install|start|stop|status|restart|start-node I|stop-node I
#
#   install  fetch the server, its standard modules and the k-NN plugin with Maven and lay them out as an
#            OpenSearch home (lib/, modules/, plugins/) in ${RAGLINE_CACHE_DIR:-~/.cache/ragline}/opensearch-<version>.
#            Idempotent: a finished install is marked and never redone.
#   start    install if needed, write config, start in the background and wait until the cluster is yellow/green.
#            A no-op (prints the URL) when already running. Cleans a stale pid file / node.lock first.
#   stop     SIGTERM, wait, then SIGKILL; leaves no process behind (every node of this state dir).
#   status   "running" (+ url, pid, health) with rc 0, or "stopped" with rc 3 (any node stopped).
#   stop-node I / start-node I
#            stop or start node I (1..NODES) alone, e.g. to test failover. In a cluster, stop-node first
#            excludes the node from the cluster-manager voting configuration (so even one of two nodes can
#            go), and start-node clears the exclusions once the node is back.
#
# Environment:
#   RAGLINE_OPENSEARCH_NODES           nodes on this machine (1); with 2..9 node I listens on PORT+I-1 and
#                                      TRANSPORT_PORT+I-1, finds its peers over loopback (discovery.seed_hosts)
#                                      and keeps its state in $RAGLINE_STATE_DIR/opensearch/node-I/
#   RAGLINE_OPENSEARCH_PORT            HTTP port (9200; of node 1)
#   RAGLINE_OPENSEARCH_TRANSPORT_PORT  transport port (9300; of node 1)
#   RAGLINE_OPENSEARCH_HEAP            JVM heap of each node, -Xms = -Xmx (1g)
#   RAGLINE_OPENSEARCH_JVM_OPTS        further JVM options of each node, space-separated (none), e.g.
#                                      -XX:TieredStopAtLevel=1 for ingest-heavy small machines (README: Benchmarks)
#   RAGLINE_OPENSEARCH_VERSION         server version (2.19.1, 2.x only); the k-NN plugin is <version>.0
#   RAGLINE_OPENSEARCH_JAVA_HOME       JDK to run with (default: /usr/lib/jvm/java-17-openjdk-amd64)
#   RAGLINE_OPENSEARCH_USER            unprivileged account used when invoked as root (ragline-opensearch)
#   RAGLINE_OPENSEARCH_START_TIMEOUT   seconds to wait for health on start (180)
#   RAGLINE_OPENSEARCH_STOP_TIMEOUT    seconds to wait after SIGTERM before SIGKILL (30)
#   RAGLINE_CACHE_DIR                  download/assembly cache (~/.cache/ragline)
#   RAGLINE_STATE_DIR                  runtime state (<repo>/.ragline); we use $RAGLINE_STATE_DIR/opensearch/
#                                      {config,data,logs,tmp,opensearch.pid} (one node) or
#                                      $RAGLINE_STATE_DIR/opensearch/node-I/{...} (a cluster)
#
# Running as root: OpenSearch refuses to start as root ("can not run opensearch as root"), so when this script
# runs as root it creates a system account (useradd --system, no login shell, no home) and runs the JVM as that
# user via setpriv (uid, gid, no supplementary groups, no capabilities). config/data/logs/tmp in the state dir
# are chowned to it. The install cache stays root-owned and read-only; if the account cannot traverse to it
# (the default cache is under /root, mode 0700) the JVM runs from a hard-linked mirror of the install in
# $RAGLINE_STATE_DIR/opensearch/home (no extra disk on the same filesystem, a copy otherwise).
#
# k-NN engines: the Maven Central zip of opensearch-knn ships no JNI libraries (libopensearchknn_*.so), so only
# the Lucene engine works. Always map knn_vector with "method": {"engine": "lucene", ...}. A faiss/nmslib field,
# or one with no method (2.19 defaults to faiss), kills the node on its first indexed document
# (java.lang.UnsatisfiedLinkError: no opensearchknn_faiss... in java.library.path is fatal to the JVM).
#
# Maven: the usual ~/.m2/settings.xml and MAVEN_OPTS apply (e.g. MAVEN_OPTS=-Dmaven.repo.local=...).
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VERSION=${RAGLINE_OPENSEARCH_VERSION:-2.19.1}
KNN_VERSION=${VERSION}.0
NODES=${RAGLINE_OPENSEARCH_NODES:-1}
BASE_PORT=${RAGLINE_OPENSEARCH_PORT:-9200}
BASE_TRANSPORT_PORT=${RAGLINE_OPENSEARCH_TRANSPORT_PORT:-9300}
HEAP=${RAGLINE_OPENSEARCH_HEAP:-1g}
EXTRA_JVM_OPTS=${RAGLINE_OPENSEARCH_JVM_OPTS:-}
START_TIMEOUT=${RAGLINE_OPENSEARCH_START_TIMEOUT:-180}
STOP_TIMEOUT=${RAGLINE_OPENSEARCH_STOP_TIMEOUT:-30}
SERVICE_USER=${RAGLINE_OPENSEARCH_USER:-ragline-opensearch}
CACHE_DIR=${RAGLINE_CACHE_DIR:-$HOME/.cache/ragline}
HOME_DIR=$CACHE_DIR/opensearch-$VERSION # the assembled OPENSEARCH_HOME (read-only at runtime)
source "$REPO_ROOT/deploy/local/lib.sh" # the state dir; quoted
OS_STATE=$STATE_DIR/opensearch
CLUSTER_NAME=ragline
MARKER=.ragline-install-complete
MVN_DEP_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.6.1
MAJOR=${VERSION%%.*}

say() { printf 'opensearch: %s\n' "$*"; }
die() { printf 'opensearch: error: %s\n' "$*" >&2; exit 1; }

# 2.x only: 3.x replaces the SecurityManager with a java agent (lib/agent) and renames the module classes;
# this assembly has not been built or tested for it.
[ "$MAJOR" = 2 ] || die "RAGLINE_OPENSEARCH_VERSION=$VERSION: only OpenSearch 2.x is supported by this assembly"
[[ $NODES =~ ^[1-9]$ ]] || die "RAGLINE_OPENSEARCH_NODES=$NODES: give a number of nodes from 1 to 9"

# Point the per-node globals at node I. One node keeps the layout of $OS_STATE itself; a cluster gives
# every node its own directory, ports and name.
select_node() { # I
  NODE=$1
  if [ "$NODES" -eq 1 ]; then
    NODE_STATE=$OS_STATE
    NODE_NAME=ragline-local
  else
    NODE_STATE=$OS_STATE/node-$NODE
    NODE_NAME=ragline-local-$NODE
  fi
  PORT=$((BASE_PORT + NODE - 1))
  TRANSPORT_PORT=$((BASE_TRANSPORT_PORT + NODE - 1))
  URL=http://127.0.0.1:$PORT
  CONF_DIR=$NODE_STATE/config
  DATA_DIR=$NODE_STATE/data
  LOGS_DIR=$NODE_STATE/logs
  TMP_DIR=$NODE_STATE/tmp
  PIDFILE=$NODE_STATE/opensearch.pid
  STDOUT_LOG=$LOGS_DIR/stdout.log
}
select_node 1

# Standard modules we ship: dir-name | Maven coordinates (groupId:artifactId) | plugin class stem | extended.plugins
# The plugin class is <stem>Plugin in 2.x jars (e.g. org.opensearch.transport.Netty4Plugin) and <stem>ModulePlugin
# in 3.x; install picks the one present in the published jar.
MODULES=(
  "transport-netty4|org.opensearch.plugin:transport-netty4-client|org.opensearch.transport.Netty4|"
  "lang-painless|org.opensearch.plugin:lang-painless|org.opensearch.painless.Painless|"
  "analysis-common|org.opensearch.plugin:analysis-common|org.opensearch.analysis.common.CommonAnalysis|lang-painless"
  "mapper-extras|org.opensearch.plugin:mapper-extras-client|org.opensearch.index.mapper.MapperExtras|"
  "reindex|org.opensearch.plugin:reindex-client|org.opensearch.index.reindex.Reindex|"
  "parent-join|org.opensearch.plugin:parent-join-client|org.opensearch.join.ParentJoin|"
  "percolator|org.opensearch.plugin:percolator-client|org.opensearch.percolator.Percolator|"
  "aggs-matrix-stats|org.opensearch.plugin:aggs-matrix-stats-client|org.opensearch.search.aggregations.matrix.MatrixAggregation|"
)

# ---------------------------------------------------------------------------------------------------- java
java_home() {
  if [ -n "${RAGLINE_OPENSEARCH_JAVA_HOME:-}" ]; then
    echo "$RAGLINE_OPENSEARCH_JAVA_HOME"
  elif [ -x /usr/lib/jvm/java-17-openjdk-amd64/bin/java ]; then
    echo /usr/lib/jvm/java-17-openjdk-amd64
  else
    dirname "$(dirname "$(readlink -f "$(command -v java)")")"
  fi
}
JAVA_HOME_OS=$(java_home)
JAVA=$JAVA_HOME_OS/bin/java

# ---------------------------------------------------------------------------------------------------- install
pom_header() { # groupId artifactId
  cat <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>ragline.local</groupId>
  <artifactId>$1</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
EOF
}

dep() { # groupId:artifactId version [type]
  printf '    <dependency><groupId>%s</groupId><artifactId>%s</artifactId><version>%s</version><type>%s</type></dependency>\n' \
    "${1%%:*}" "${1#*:}" "$2" "${3:-jar}"
}

# copy-dependencies in repository layout (group/artifact/version/file) so we know each jar's coordinates
copy_build() { # outputDirectory
  cat <<EOF
  <build><plugins><plugin>
    <groupId>org.apache.maven.plugins</groupId><artifactId>maven-dependency-plugin</artifactId><version>3.6.1</version>
    <executions><execution><id>copy</id><phase>package</phase><goals><goal>copy-dependencies</goal></goals>
      <configuration>
        <outputDirectory>$1</outputDirectory>
        <includeScope>runtime</includeScope>
        <useRepositoryLayout>true</useRepositoryLayout>
      </configuration>
    </execution></executions>
  </plugin></plugins></build>
</project>
EOF
}

# version of a dependency declared in a pom (used for the server's optional runtime deps)
pom_dep_version() { # pomfile artifactId
  grep -A1 "<artifactId>$2</artifactId>" "$1" | sed -n 's:.*<version>\(.*\)</version>.*:\1:p' | head -n1
}

# flatten a repository-layout tree into DEST, skipping artifacts listed in SKIPFILE (groupId/artifactId lines);
# appends what it copied to ADDFILE
flatten() { # srcRepoDir dest skipfile addfile
  local src=$1 dest=$2 skip=$3 add=$4 f rel ga
  mkdir -p "$dest"
  while IFS= read -r f; do
    rel=${f#"$src"/}            # org/apache/lucene/lucene-core/9.12.1/lucene-core-9.12.1.jar
    ga=$(dirname "$(dirname "$rel")") # org/apache/lucene/lucene-core
    if [ -n "$skip" ] && grep -qxF "$ga" "$skip"; then
      continue
    fi
    cp "$f" "$dest/"
    echo "$ga" >>"$add"
  done < <(find "$src" -name '*.jar' | sort)
}

write_descriptor() { # dir name classname extended
  cat >"$1/plugin-descriptor.properties" <<EOF
# Written by ragline deploy/local/opensearch.sh (modules published on Maven Central carry no descriptor).
description=OpenSearch module $2 (assembled from Maven Central)
version=$VERSION
name=$2
classname=$3
java.version=11
opensearch.version=$VERSION
extended.plugins=$4
has.native.controller=false
EOF
}

# plugin-security.policy files of the official modules (modules/*/src/main/plugin-metadata in OpenSearch)
write_policy() { # dir name
  local f=$1/plugin-security.policy
  case "$2" in
    transport-netty4)
      cat >"$f" <<'EOF'
grant {
   // for reading the system-wide configuration for the backlog of established sockets
   permission java.io.FilePermission "/proc/sys/net/core/somaxconn", "read";
   // netty makes and accepts socket connections
   permission java.net.SocketPermission "*", "accept,connect";
   // Netty sets custom classloader for some of its internal threads
   permission java.lang.RuntimePermission "*", "setContextClassLoader";
   permission java.lang.RuntimePermission "getClassLoader";
   // Netty NioEventLoop wants to change this, because of https://bugs.openjdk.java.net/browse/JDK-6427854
   permission java.util.PropertyPermission "sun.nio.ch.bugLevel", "write";
};
EOF
      ;;
    lang-painless)
      cat >"$f" <<'EOF'
grant {
  // needed to generate runtime classes
  permission java.lang.RuntimePermission "createClassLoader";
  // needed to find the classloader to load allowlisted classes from
  permission java.lang.RuntimePermission "getClassLoader";
};
EOF
      ;;
    reindex)
      cat >"$f" <<'EOF'
grant {
  // reindex opens socket connections using the rest client
  permission java.net.SocketPermission "*", "connect";
};
grant codeBase "${codebase.opensearch-rest-client}" {
  // rest client uses system properties which gets the default proxy
  permission java.net.NetPermission "getProxySelector";
};
grant codeBase "${codebase.httpasyncclient}" {
  // rest client uses system properties which gets the default proxy
  permission java.net.NetPermission "getProxySelector";
};
EOF
      ;;
  esac
}

install() {
  if [ -f "$HOME_DIR/$MARKER" ]; then
    say "installed: $HOME_DIR"
    return 0
  fi
  command -v mvn >/dev/null || die "mvn not found (apt-get install maven)"
  [ -x "$JAVA" ] || die "no java at $JAVA (set RAGLINE_OPENSEARCH_JAVA_HOME)"
  local t0=$SECONDS work build stage m name ga cls ext mdir
  mkdir -p "$CACHE_DIR"
  work=$(mktemp -d "$CACHE_DIR/.opensearch-$VERSION.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  build=$work/build
  stage=$work/home
  mkdir -p "$build" "$stage"/{bin,lib,modules,plugins} # bin/ must exist (Security adds path.home/bin)
  say "assembling OpenSearch $VERSION + k-NN $KNN_VERSION from Maven Central (in $work)"

  # 1. the server pom tells us the versions of its optional runtime deps (log4j-core, jts, spatial4j)
  JAVA_HOME=$JAVA_HOME_OS mvn -B -q -Dstyle.color=never "$MVN_DEP_PLUGIN:copy" \
    -Dartifact="org.opensearch:opensearch:$VERSION:pom" -DoutputDirectory="$build" >"$build/mvn-pom.log" 2>&1 ||
    { tail -n 20 "$build/mvn-pom.log" >&2; die "could not fetch org.opensearch:opensearch:$VERSION:pom from Maven Central"; }
  local spom=$build/opensearch-$VERSION.pom

  # 2. one reactor: server runtime classpath, one sub-project per module, and the k-NN plugin zip
  {
    pom_header server
    echo "  <dependencies>"
    dep org.opensearch:opensearch "$VERSION"
    # runtime-only jars of the distribution's lib/ that the server pom does not list
    dep org.opensearch:opensearch-plugin-classloader "$VERSION"
    dep org.apache.logging.log4j:log4j-core "$(pom_dep_version "$spom" log4j-core)"
    dep org.locationtech.jts:jts-core "$(pom_dep_version "$spom" jts-core)"
    dep org.locationtech.spatial4j:spatial4j "$(pom_dep_version "$spom" spatial4j)"
    echo "  </dependencies>"
    copy_build "$build/repo/server"
  } >"$build/server.xml"
  local modlist=""
  for m in "${MODULES[@]}"; do
    IFS='|' read -r name ga cls ext <<<"$m"
    mkdir -p "$build/m-$name"
    {
      pom_header "m-$name"
      echo "  <dependencies>"
      dep "$ga" "$VERSION"
      echo "  </dependencies>"
      copy_build "$build/repo/$name"
    } >"$build/m-$name/pom.xml"
    modlist+="    <module>m-$name</module>"$'\n'
  done
  mkdir -p "$build/m-server" "$build/m-knn"
  mv "$build/server.xml" "$build/m-server/pom.xml"
  {
    pom_header m-knn
    cat <<EOF
  <build><plugins><plugin>
    <groupId>org.apache.maven.plugins</groupId><artifactId>maven-dependency-plugin</artifactId><version>3.6.1</version>
    <executions><execution><id>unpack</id><phase>package</phase><goals><goal>unpack</goal></goals>
      <configuration>
        <artifactItems><artifactItem>
          <groupId>org.opensearch.plugin</groupId><artifactId>opensearch-knn</artifactId>
          <version>$KNN_VERSION</version><type>zip</type>
          <outputDirectory>$stage/plugins/opensearch-knn</outputDirectory>
        </artifactItem></artifactItems>
      </configuration>
    </execution></executions>
  </plugin></plugins></build>
</project>
EOF
  } >"$build/m-knn/pom.xml"
  {
    pom_header reactor
    printf '  <modules>\n    <module>m-server</module>\n%s    <module>m-knn</module>\n  </modules>\n</project>\n' "$modlist"
  } >"$build/pom.xml"
  say "resolving artifacts with mvn (first run downloads ~150 MB into ~/.m2)"
  if ! (cd "$build" && JAVA_HOME=$JAVA_HOME_OS mvn -B -q -Dstyle.color=never -T 2 package >"$build/mvn.log" 2>&1); then
    tail -n 40 "$build/mvn.log" >&2
    die "mvn failed (full log above)"
  fi

  # 3. lay out OPENSEARCH_HOME: lib/ = server classpath; modules/<name>/ = module jars minus what lib/ has
  : >"$build/lib.ga"
  flatten "$build/repo/server" "$stage/lib" "" "$build/lib.ga"
  for m in "${MODULES[@]}"; do
    IFS='|' read -r name ga cls ext <<<"$m"
    mdir=$stage/modules/$name
    : >"$build/$name.ga"
    flatten "$build/repo/$name" "$mdir" "$build/lib.ga" "$build/$name.ga"
    # modules that extend lang-painless must not repeat its jars (jar hell across the parent loader)
    if [ "$ext" = lang-painless ]; then
      while IFS= read -r g; do rm -f "$mdir/$(basename "$g")"-[0-9]*.jar; done <"$build/lang-painless.ga"
    fi
    local classes c found=""
    classes=$(for j in "$mdir"/*.jar; do unzip -Z1 "$j"; done 2>/dev/null)
    for c in "${cls}ModulePlugin" "${cls}Plugin"; do
      if grep -qxF "${c//.//}.class" <<<"$classes"; then found=$c && break; fi
    done
    [ -n "$found" ] || die "module $name: neither ${cls}ModulePlugin nor ${cls}Plugin in its jars"
    cls=$found
    write_descriptor "$mdir" "$name" "$cls" "$ext"
    write_policy "$mdir" "$name"
  done
  [ -f "$stage/plugins/opensearch-knn/plugin-descriptor.properties" ] || die "k-NN zip has no plugin descriptor"
  grep -qx "opensearch.version=$VERSION" "$stage/plugins/opensearch-knn/plugin-descriptor.properties" ||
    die "k-NN $KNN_VERSION is not built for OpenSearch $VERSION"
  cp "$build/m-server/pom.xml" "$stage/.server-pom.xml"
  (cd "$stage" && find lib modules plugins -type f | sort) >"$stage/MANIFEST"
  chmod -R a+rX "$stage"
  printf 'version=%s\nknn=%s\ninstalled=%s\n' "$VERSION" "$KNN_VERSION" "$(date -u +%FT%TZ)" >"$stage/$MARKER"

  rm -rf "$HOME_DIR"
  mv "$stage" "$HOME_DIR"
  rm -rf "$work"
  trap - EXIT
  say "installed OpenSearch $VERSION + k-NN $KNN_VERSION in $HOME_DIR ($((SECONDS - t0))s)"
}

# ---------------------------------------------------------------------------------------------------- process
# pids of JVMs running with our config dir (the source of truth; the pid file is a convenience);
# with "all", those of every node of this state dir, whatever RAGLINE_OPENSEARCH_NODES says now
find_pids() { # [all]
  local p cmd
  for p in /proc/[0-9]*; do
    cmd=$(tr '\0' ' ' 2>/dev/null <"$p/cmdline") || continue
    case "$cmd" in *org.opensearch.bootstrap.OpenSearch*) ;; *) continue ;; esac
    if [ "${1:-}" = all ]; then # a node's own config dir, not one of a state dir nested inside
      case "$cmd" in *"-Dopensearch.path.conf=$OS_STATE/"*) ;; *) continue ;; esac
      if [[ ${cmd#*"-Dopensearch.path.conf=$OS_STATE/"} =~ ^(node-[0-9]+/)?config\  ]]; then
        echo "${p#/proc/}"
      fi
    else
      case "$cmd" in *"-Dopensearch.path.conf=$CONF_DIR "*) echo "${p#/proc/}" ;; esac
    fi
  done
}

running_pid() {
  local pids
  pids=$(find_pids)
  [ -n "$pids" ] || return 1
  echo "$pids" | head -n1
}

health() { # prints cluster status or nothing
  { curl -fsS --max-time 5 "$URL/_cluster/health" 2>/dev/null || true; } | sed -n 's/.*"status":"\([a-z]*\)".*/\1/p'
}

# A cluster bootstraps once, when no node has any state yet; listing the initial cluster managers
# on a later start could let a wiped node elect a cluster of its own.
cluster_bootstrapped() {
  local i
  for ((i = 1; i <= NODES; i++)); do
    [ ! -d "$OS_STATE/node-$i/data/nodes" ] || return 0
  done
  return 1
}

discovery_config() {
  if [ "$NODES" -eq 1 ]; then
    echo "discovery.type: single-node"
    return 0
  fi
  local i seeds="" names=""
  for ((i = 1; i <= NODES; i++)); do
    seeds+="${seeds:+, }127.0.0.1:$((BASE_TRANSPORT_PORT + i - 1))"
    names+="${names:+, }ragline-local-$i"
  done
  echo "discovery.seed_hosts: [$seeds]"
  if ! cluster_bootstrapped; then
    echo "cluster.initial_cluster_manager_nodes: [$names]"
  fi
}

write_config() {
  mkdir -p "$CONF_DIR" "$DATA_DIR" "$LOGS_DIR" "$TMP_DIR"
  cat >"$CONF_DIR/opensearch.yml" <<EOF
# Generated by deploy/local/opensearch.sh on every start; edit the script, not this file.
cluster.name: $CLUSTER_NAME
node.name: $NODE_NAME
path.data: $(quoted "$DATA_DIR")
path.logs: $(quoted "$LOGS_DIR")
network.host: 127.0.0.1
http.port: $PORT
transport.port: $TRANSPORT_PORT
$(discovery_config)
bootstrap.memory_lock: false
# seccomp filter install can fail inside containers; not needed for a local dev node
bootstrap.system_call_filter: false
# a nearly full dev disk must never flip indices to read-only or block shard allocation
cluster.routing.allocation.disk.threshold_enabled: false
action.destructive_requires_name: false
EOF
  local locale=SPI,COMPAT extra
  # The files the JVM itself writes are named relative to the dir it runs in, $OS_STATE (launch):
  # -Xlog takes no '"' in a file name (nor ':' or ',' unquoted), and -XX's file options read '%'.
  local logs=${LOGS_DIR#"$OS_STATE"/} data=${DATA_DIR#"$OS_STATE"/}
  # shellcheck disable=SC2086  # one option per line: splitting the list on spaces is intended
  extra=$(printf '%s\n' $EXTRA_JVM_OPTS)
  cat >"$CONF_DIR/jvm.options" <<EOF
# Generated by deploy/local/opensearch.sh: distribution/src/config/jvm.options + the launcher's system options.
-Xms$HEAP
-Xmx$HEAP
-XX:+UseG1GC
-XX:G1ReservePercent=25
-XX:InitiatingHeapOccupancyPercent=30
-Djava.io.tmpdir=$TMP_DIR
-XX:+HeapDumpOnOutOfMemoryError
-XX:HeapDumpPath=$data
-XX:ErrorFile=$logs/hs_err_pid%p.log
-Xlog:gc*,gc+age=trace,safepoint:file=$logs/gc.log:utctime,pid,tags:filecount=4,filesize=16m
-Dopensearch.networkaddress.cache.ttl=60
-Dopensearch.networkaddress.cache.negative.ttl=10
-Xss1m
-Djava.awt.headless=true
-Dfile.encoding=UTF-8
-Djna.nosys=true
-XX:-OmitStackTraceInFastThrow
-XX:+ShowCodeDetailsInExceptionMessages
-Dio.netty.noUnsafe=true
-Dio.netty.noKeySetOptimization=true
-Dio.netty.recycler.maxCapacityPerThread=0
-Dio.netty.allocator.numDirectArenas=0
-Dlog4j.shutdownHookEnabled=false
-Dlog4j2.disable.jmx=true
-Djava.locale.providers=$locale
$extra
EOF
  cat >"$CONF_DIR/log4j2.properties" <<'EOF'
# Generated by deploy/local/opensearch.sh (a trimmed distribution/src/config/log4j2.properties).
status = error

appender.rolling.type = RollingFile
appender.rolling.name = rolling
appender.rolling.fileName = ${sys:opensearch.logs.base_path}${sys:file.separator}${sys:opensearch.logs.cluster_name}.log
appender.rolling.layout.type = PatternLayout
appender.rolling.layout.pattern = [%d{ISO8601}][%-5p][%-25c{1.}] [%node_name]%marker %m%n
appender.rolling.filePattern = ${sys:opensearch.logs.base_path}${sys:file.separator}${sys:opensearch.logs.cluster_name}-%i.log.gz
appender.rolling.policies.type = Policies
appender.rolling.policies.size.type = SizeBasedTriggeringPolicy
appender.rolling.policies.size.size = 64MB
appender.rolling.strategy.type = DefaultRolloverStrategy
appender.rolling.strategy.max = 4

rootLogger.level = info
rootLogger.appenderRef.rolling.ref = rolling

appender.deprecation_rolling.type = RollingFile
appender.deprecation_rolling.name = deprecation_rolling
appender.deprecation_rolling.fileName = ${sys:opensearch.logs.base_path}${sys:file.separator}${sys:opensearch.logs.cluster_name}_deprecation.log
appender.deprecation_rolling.layout.type = PatternLayout
appender.deprecation_rolling.layout.pattern = [%d{ISO8601}][%-5p][%-25c{1.}] [%node_name]%marker %m%n
appender.deprecation_rolling.filePattern = ${sys:opensearch.logs.base_path}${sys:file.separator}${sys:opensearch.logs.cluster_name}_deprecation-%i.log.gz
appender.deprecation_rolling.policies.type = Policies
appender.deprecation_rolling.policies.size.type = SizeBasedTriggeringPolicy
appender.deprecation_rolling.policies.size.size = 16MB
appender.deprecation_rolling.strategy.type = DefaultRolloverStrategy
appender.deprecation_rolling.strategy.max = 2
appender.header_warning.type = HeaderWarningAppender
appender.header_warning.name = header_warning

logger.deprecation.name = org.opensearch.deprecation
logger.deprecation.level = deprecation
logger.deprecation.appenderRef.deprecation_rolling.ref = deprecation_rolling
logger.deprecation.appenderRef.header_warning.ref = header_warning
logger.deprecation.additivity = false
EOF
}

# Root: OpenSearch refuses to run as root, so we run the JVM as SERVICE_USER (created on first use).
ensure_service_user() {
  if ! id -u "$SERVICE_USER" >/dev/null 2>&1; then
    say "creating system user $SERVICE_USER to run the JVM (OpenSearch refuses to run as root)"
    useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
      "$SERVICE_USER" >/dev/null || die "could not create service user $SERVICE_USER"
  fi
}

as_service() { # run a command as SERVICE_USER
  setpriv --reuid="$(id -u "$SERVICE_USER")" --regid="$(id -g "$SERVICE_USER")" --clear-groups "$@"
}

# The home the JVM runs from: the install itself, or, when the service user cannot reach it (cache under
# /root, mode 0700), a hard-linked mirror in the state dir (cp -al: no extra disk; plain copy across
# filesystems). The mirror is refreshed whenever the install marker changes.
runtime_home() {
  if [ "$(id -u)" -ne 0 ] || as_service test -r "$HOME_DIR/$MARKER"; then
    echo "$HOME_DIR"
    return 0
  fi
  local mirror=$OS_STATE/home
  if ! cmp -s "$HOME_DIR/$MARKER" "$mirror/$MARKER" 2>/dev/null; then
    rm -rf "$mirror" "$mirror.tmp"
    cp -al "$HOME_DIR" "$mirror.tmp" 2>/dev/null || { rm -rf "$mirror.tmp" && cp -a "$HOME_DIR" "$mirror.tmp"; }
    mv "$mirror.tmp" "$mirror"
  fi
  echo "$mirror"
}

# Start this node's JVM in the background: LAUNCHER is the launcher's pid, empty when the node already ran.
launch() {
  local pid
  LAUNCHER=""
  if pid=$(running_pid); then
    echo "$pid" >"$PIDFILE"
    say "already running on $URL (pid $pid, cluster health $(health || true))"
    return 0
  fi
  # stale state from a crashed / SIGKILLed run
  if [ -f "$PIDFILE" ]; then
    say "removing stale pid file $PIDFILE"
    rm -f "$PIDFILE"
  fi
  if [ -d "$DATA_DIR" ]; then
    find "$DATA_DIR" -name node.lock -delete 2>/dev/null || true
  fi
  if curl -s --max-time 2 -o /dev/null "$URL" 2>/dev/null; then
    die "port $PORT already answers HTTP but not from this state dir ($OS_STATE); stop it or set RAGLINE_OPENSEARCH_PORT (docs/configuration.md#local-stack-scripts)"
  fi

  write_config
  : >"$STDOUT_LOG"
  LOG_OFFSET=$(($(stat -c %s "$LOGS_DIR/$CLUSTER_NAME.log" 2>/dev/null || echo 0) + 1))
  local prefix="" os_home=$HOME_DIR
  if [ "$(id -u)" -eq 0 ]; then
    if unshare --user --map-user=1000 --map-group=1000 true 2>/dev/null; then
      # A user namespace: the JVM sees an unprivileged uid (OpenSearch refuses root), while the
      # kernel still checks files as their root owner, so any state dir and cache path works.
      prefix="unshare --user --map-user=1000 --map-group=1000"
      # State written by an earlier service-user run must belong to root again.
      find "$CONF_DIR" "$DATA_DIR" "$LOGS_DIR" "$TMP_DIR" ! -uid 0 -exec chown 0:0 {} + 2>/dev/null || true
    else
      ensure_service_user
      chown -R "$SERVICE_USER:" "$CONF_DIR" "$DATA_DIR" "$LOGS_DIR" "$TMP_DIR"
      prefix="setpriv --reuid=$(id -u "$SERVICE_USER") --regid=$(id -g "$SERVICE_USER") --clear-groups"
      os_home=$(runtime_home)
    fi
  fi

  # One option a line, each one argument: the state dir's path may hold spaces.
  local jvm_opts
  mapfile -t jvm_opts < <(grep -v -e '^#' -e '^$' "$CONF_DIR/jvm.options")
  # shellcheck disable=SC2086  # word splitting of the setpriv prefix is intended
  (
    cd "$OS_STATE"
    exec 9>&- # do not leak the state lock into the JVM
    exec setsid $prefix env -i PATH=/usr/bin:/bin LANG=C.UTF-8 HOSTNAME="$(hostname)" \
      JAVA_HOME="$JAVA_HOME_OS" OPENSEARCH_PATH_CONF="$CONF_DIR" OPENSEARCH_TMPDIR="$TMP_DIR" \
      "$JAVA" -Xshare:auto "${jvm_opts[@]}" \
      -Dopensearch.path.home="$os_home" \
      -Dopensearch.path.conf="$CONF_DIR" \
      -Dopensearch.distribution.type=tar \
      -Dopensearch.bundled_jdk=false \
      -cp "$os_home/lib/*" \
      org.opensearch.bootstrap.OpenSearch
  ) >>"$STDOUT_LOG" 2>&1 </dev/null &
  LAUNCHER=$!
  LAUNCHED+=("$NODE")
  say "starting OpenSearch $VERSION on $URL (heap $HEAP, java $JAVA, logs $LOGS_DIR)"
}

# Wait until this node reports a yellow or green cluster (a cluster's node does once a manager is elected).
wait_healthy() { # launcher-pid
  local launcher=$1 pid deadline=$((SECONDS + START_TIMEOUT)) h=""
  while [ $SECONDS -lt $deadline ]; do
    pid=$(running_pid) || pid=""
    if [ -z "$pid" ] && ! kill -0 "$launcher" 2>/dev/null; then
      fail_start "the JVM exited during startup"
    fi
    [ -n "$pid" ] && echo "$pid" >"$PIDFILE"
    h=$(health)
    if [ "$h" = green ] || [ "$h" = yellow ]; then
      say "running on $URL (pid $pid, cluster health $h, data in $DATA_DIR)"
      return 0
    fi
    sleep 1
  done
  fail_start "not healthy within ${START_TIMEOUT}s (cluster health: ${h:-no answer})"
}

# Start every node that is not running (all launched before any is waited for: a cluster forms only
# once its nodes find each other), then wait for each.
start_all() {
  local i launchers=() offsets=()
  for ((i = 1; i <= NODES; i++)); do
    select_node "$i"
    launch
    launchers[i]=$LAUNCHER
    offsets[i]=${LOG_OFFSET:-1}
  done
  for ((i = 1; i <= NODES; i++)); do
    select_node "$i"
    LOG_OFFSET=${offsets[i]}
    [ -z "${launchers[i]}" ] || wait_healthy "${launchers[i]}"
  done
  if [ "$NODES" -gt 1 ]; then
    clear_voting_exclusions
    say "cluster $CLUSTER_NAME: $(cluster_summary)"
  fi
}

start_node() {
  launch
  [ -z "$LAUNCHER" ] || wait_healthy "$LAUNCHER"
  if [ "$NODES" -gt 1 ]; then
    clear_voting_exclusions
    say "cluster $CLUSTER_NAME: $(cluster_summary)"
  fi
}

# Stopping a cluster-manager-eligible node gracefully: take it out of the voting configuration first,
# or in a cluster of two the survivor may be unable to elect itself. Asks any other node that answers.
exclude_from_voting() {
  local i url
  for ((i = 1; i <= NODES; i++)); do
    [ "$i" -ne "$NODE" ] || continue
    url=http://127.0.0.1:$((BASE_PORT + i - 1))
    if curl -fsS --max-time 70 -X POST -o /dev/null \
      "$url/_cluster/voting_config_exclusions?node_names=$NODE_NAME&timeout=60s" 2>/dev/null; then
      say "$NODE_NAME left the cluster-manager vote (asked $url)"
      return 0
    fi
  done
  say "warning: no other node took $NODE_NAME out of the cluster-manager vote; stopping it anyway"
}

clear_voting_exclusions() {
  curl -fsS --max-time 30 -X DELETE -o /dev/null \
    "$URL/_cluster/voting_config_exclusions?wait_for_removal=false" 2>/dev/null ||
    say "warning: could not clear the voting exclusions on $URL"
}

stop_node() {
  if [ "$NODES" -gt 1 ] && [ -n "$(find_pids)" ]; then
    exclude_from_voting
  fi
  stop
}

cluster_summary() {
  local body
  body=$(curl -fsS --max-time 5 "$URL/_cluster/health" 2>/dev/null) || { echo "no answer from $URL"; return 0; }
  printf 'status %s, %s nodes, %s unassigned shards\n' \
    "$(sed -n 's/.*"status":"\([a-z]*\)".*/\1/p' <<<"$body")" \
    "$(sed -n 's/.*"number_of_nodes":\([0-9]*\).*/\1/p' <<<"$body")" \
    "$(sed -n 's/.*"unassigned_shards":\([0-9]*\).*/\1/p' <<<"$body")"
}

fail_start() {
  {
    printf 'opensearch: error: %s\n' "$1"
    printf -- '--- last lines of %s\n' "$STDOUT_LOG"
    tail -n 30 "$STDOUT_LOG" 2>/dev/null || true
    printf -- '--- last lines of %s\n' "$LOGS_DIR/$CLUSTER_NAME.log"
    tail -c "+${LOG_OFFSET:-1}" "$LOGS_DIR/$CLUSTER_NAME.log" 2>/dev/null | tail -n 40 || true
  } >&2
  local i
  for i in "${LAUNCHED[@]}"; do # what this call started, and nothing else
    select_node "$i"
    stop >/dev/null 2>&1 || true
  done
  exit 1
}

# Stop this node, or with "all" every node of this state dir.
stop() { # [all]
  local scope=${1:-} pids pid i pidfiles=("$PIDFILE")
  [ "$scope" != all ] || pidfiles=("$OS_STATE/opensearch.pid" "$OS_STATE"/node-*/opensearch.pid)
  pids=$(find_pids "$scope" | tr '\n' ' ')
  if [ -z "${pids// /}" ]; then
    rm -f "${pidfiles[@]}"
    say "not running"
    return 0
  fi
  # shellcheck disable=SC2086
  kill -TERM $pids 2>/dev/null || true
  for ((i = 0; i < STOP_TIMEOUT * 5; i++)); do
    [ -n "$(find_pids "$scope")" ] || break
    sleep 0.2
  done
  pids=$(find_pids "$scope" | tr '\n' ' ')
  if [ -n "${pids// /}" ]; then
    say "did not stop within ${STOP_TIMEOUT}s, sending SIGKILL to $pids"
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
      [ -n "$(find_pids "$scope")" ] || break
      sleep 0.2
    done
    [ -z "$(find_pids "$scope")" ] || die "could not kill $(find_pids "$scope" | tr '\n' ' ')"
  fi
  rm -f "${pidfiles[@]}"
  say "stopped"
}

status() {
  local i pid label="" rc=0
  for ((i = 1; i <= NODES; i++)); do
    select_node "$i"
    [ "$NODES" -eq 1 ] || label="$NODE_NAME: "
    if pid=$(running_pid); then
      say "${label}running on $URL (pid $pid, cluster health $(health || true))"
    else
      say "${label}stopped ($URL)"
      rc=3
    fi
  done
  return $rc
}

node_arg() { # I: select node I of 1..NODES
  [[ ${1:-} =~ ^[1-9]$ ]] && [ "$1" -le "$NODES" ] ||
    die "give a node number from 1 to $NODES (RAGLINE_OPENSEARCH_NODES=$NODES)"
  select_node "$1"
}

install_once() {
  if [ ! -f "$HOME_DIR/$MARKER" ]; then
    lock "$CACHE_DIR/.opensearch-$VERSION.lock"
    install
  fi
}

# serialise concurrent invocations: one lock per cache (install) and one per state dir (start/stop)
lock() { # file
  mkdir -p "$(dirname "$1")"
  exec 9>"$1"
  flock -w 600 9 || die "timed out waiting for lock $1"
}

LAUNCHED=()
case "${1:-}" in
  install) lock "$CACHE_DIR/.opensearch-$VERSION.lock" && install ;;
  start | restart)
    install_once
    lock "$OS_STATE/.lock" # (re)opening fd 9 releases the install lock
    if [ "$1" = restart ]; then stop all; fi
    start_all
    ;;
  stop) lock "$OS_STATE/.lock" && stop all ;;
  status) status ;;
  start-node)
    node_arg "${2:-}"
    install_once
    lock "$OS_STATE/.lock"
    start_node
    ;;
  stop-node) node_arg "${2:-}" && lock "$OS_STATE/.lock" && stop_node ;;
  *) die "usage: opensearch.sh install|start|stop|status|restart|start-node I|stop-node I" ;;
esac
