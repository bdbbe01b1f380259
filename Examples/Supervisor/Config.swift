import Foundation

/// The supervisor's configuration file (JSON):
///
/// ```json
/// { "programs": [
///     { "name": "web", "command": ["/usr/bin/python3", "-m", "http.server", "8000"],
///       "restart": "always", "health": "http://127.0.0.1:8000/" },
///     { "name": "once", "command": ["/bin/echo", "hello"], "restart": "never" } ] }
/// ```
///
/// `restart`: `always` (the default), `on-failure` (an exit other than 0), `never`. `health`: a
/// URL checked every `healthInterval` seconds (default 2) with a GET; 2xx and 3xx are healthy.
/// `grace`: seconds between SIGTERM and SIGKILL when the program is stopped (default 5).
struct SupervisorConfig: Decodable, Equatable {
    struct Program: Decodable, Equatable {
        enum Restart: String, Decodable { case always, onFailure = "on-failure", never }
        var name: String
        var command: [String]
        var restart: Restart
        var health: String?
        var grace: Double

        enum CodingKeys: String, CodingKey { case name, command, restart, health, grace }

        init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            name = try container.decode(String.self, forKey: .name)
            command = try container.decode([String].self, forKey: .command)
            restart = try container.decodeIfPresent(Restart.self, forKey: .restart) ?? .always
            health = try container.decodeIfPresent(String.self, forKey: .health)
            grace = try container.decodeIfPresent(Double.self, forKey: .grace) ?? 5
            guard !command.isEmpty else {
                throw DecodingError.dataCorruptedError(forKey: .command, in: container, debugDescription: "empty command")
            }
        }
    }

    var programs: [Program]
    var healthInterval: Double?

    /// Reads and checks the file; the error says what is wrong.
    static func load(_ path: String) throws -> SupervisorConfig {
        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        let config = try JSONDecoder().decode(SupervisorConfig.self, from: data)
        var names = Set<String>()
        for program in config.programs where !names.insert(program.name).inserted {
            throw ConfigError(message: "two programs named \(program.name)")
        }
        return config
    }
}

struct ConfigError: Error, CustomStringConvertible {
    var message: String
    var description: String { message }
}
